"""How the bench's results read: the markdown report, the short table printed last, the
target lines and the PNG plot (:mod:`.report` builds the results they render)."""

from __future__ import annotations

from pathlib import Path

from spillway.options.gpus import topology_lines
from spillway.options.sizes import format_bytes

from . import previous, timeline
from .formatting import columns, fmt_bytes, fmt_percent, fmt_value, gpu_list, stack_line
from .sides import NAMES as SIDES

#: the ceiling each move between device and host is read against (the 70% target's)
SPILL_CEILINGS = {"device_to_host": "d2h_pinned", "host_to_device": "h2d_pinned"}


def spills(w: dict) -> bool:
    """Whether spillway's side of a workload moved data between device and host."""
    moves = (w.get("spillway") or {}).get("spill_moves") or {}
    return any((moves.get(m) or {}).get("bytes", 0) > 0 for m in SPILL_CEILINGS) or bool(w.get("bytes_spilled"))


def markdown(results: dict) -> str:
    m = results["machine"]
    gpus = gpu_list(m)
    parts = results.get("parts")
    when = (f"- started {results['started']}, finished {results['finished']}" if not parts else
            "- runs: " + "; ".join(f"{', '.join(p['workloads'])} from {p['started']} to {p['finished']}"
                                    for p in parts))
    lines = [
        f"# spillway bench: {m['name']}",
        "",
        when,
        f"- sizes `{results['sizes']}`, {results['runs']} timed runs after one warm-up, median shown",
        *([f"- label `{results['label']}`"] if results.get("label") else []),
        *(["- baseline not run (--no-baseline): compare with an earlier results file"]
          if results.get("baseline_run") is False else []),
        f"- workers: {m['workers']}; GPUs: {gpus}; driver {m['driver_version']}, CUDA {m['cuda_driver_version']}",
        f"- CPU: {m['cpu']}, {m['cores']} cores, {format_bytes(m['memory_total'])}; {m['platform']}",
        stack_line(m),
    ]
    links = topology_lines(m["gpus"])
    if links:
        lines += ["", "```", *links, "```"]
    for side in SIDES:
        c = results["clusters"].get(side)
        if c:
            what = c.get("cluster") or "spillway " + ", ".join(f"{k}={v}" for k, v in c.get("options", {}).items())
            lines.append(f"- {side}: {c['n_workers']} {c['kind']} workers over {c.get('transport') or c['protocol']}; "
                         f"{what}")
    lines += ["", "## Ceilings", "", f"Measured with {format_bytes(results['ceiling_bytes'])} buffers.", "",
              "| ceiling | GB/s |", "| --- | ---: |"]
    for name, value in results["ceilings"].items():
        unit = " TFLOP/s" if name.endswith("_tflops") else ""
        lines.append(f"| {name} | {value:.1f}{unit} |")
    for name, why in results["ceilings_skipped"].items():
        lines.append(f"| {name} | skipped: {why} |")
    lines += [
        "", "## Workloads", "",
        "| workload | spillway s | baseline s | speedup | transfer GB/s p25 / median / p75 "
        "| of peer copy | baseline transfer GB/s | moved | spilled (spillway / baseline) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for w in results["workloads"]:
        bw = " / ".join(fmt_value(w[k], "{:.1f}")
                        for k in ("transfer_gbps_p25", "transfer_gbps_median", "transfer_gbps_p75"))
        lines.append(
            f"| {w['name']}: {w['description']} | {fmt_value(w['spillway_s'])} | {fmt_value(w['baseline_s'])} "
            f"| {fmt_value(w['speedup'], '{:.2f}x')} | {bw} | {fmt_percent(w['transfer_ratio_to_peer_copy'])} "
            f"| {fmt_value(w['baseline_transfer_gbps_median'], '{:.1f}')} | {fmt_bytes(w['bytes_moved'])} "
            f"| {fmt_bytes(w['bytes_spilled'])} / {fmt_bytes(w['baseline_bytes_spilled'])} |"
        )
    lines += out_of_core_section(results["workloads"])
    lines += _spill_section(results["workloads"])
    lines += _bound_section(results["workloads"])
    lines += bounds_section(results)
    lines += _tiers_section(results["workloads"])
    lines += timeline.markdown_section(results)
    lines += previous_section(results)
    if results.get("targets"):
        lines += ["", "## Targets", "", "| workload | target | value | met |", "| --- | --- | ---: | --- |"]
        for t in results["targets"]:
            lines.append(f"| {t['name']} | {t['target']} | {_target_value(t)} | {_met(t)} |")
    notes = []
    for w in results["workloads"]:
        for side in SIDES:
            d = w.get(side) or {}
            if d.get("error"):
                expected = f" (expected: {d['expected_failure']})" if d.get("expected_failure") else ""
                notes.append(f"- {w['name']} {side}: failed: {d['error']}{expected}")
            if d.get("skipped"):
                notes.append(f"- {w['name']} {side}: {d['skipped']}")
            if d.get("source") and d["source"] != "direct" and side == "spillway":
                notes.append(f"- {w['name']}: built by {d['source']}")
            for note in d.get("notes", []) if side == "spillway" else []:
                notes.append(f"- {w['name']}: {note}")
    if notes:
        lines += ["", "## Notes", ""] + notes
    return "\n".join(lines) + "\n"


def out_of_core_rows(workloads: list[dict]) -> list[tuple[str, ...]]:
    """Per out-of-core row and side: first run, median, the tiers' bound of each, time
    over bound, and spillway over ``tasks_method`` (on spillway's line)."""
    rows = []
    for w in workloads:
        ooc = w.get("out_of_core")
        if not ooc:
            continue
        for side, d in ooc["sides"].items():
            if d.get("skipped"):
                time = ("skipped", "—")
            elif d.get("error"):
                time = ("failed" + (" (expected)" if d.get("expected_failure") else ""), "—")
            else:
                time = (fmt_value(d.get("first_s")), fmt_value(d.get("median_s")))
            versus = "—"
            if side == "spillway":
                versus = (f"{fmt_value(ooc.get('first_spillway_over_tasks_method'), '{:.2f}x')} / "
                          f"{fmt_value(ooc.get('spillway_over_tasks_method'), '{:.2f}x')}")
            detail = w.get(side) or {}
            bound = (f"{_tiers_bound_text(d.get('first_bound_s'), detail.get('first_tiers_bound'))} / "
                     f"{_tiers_bound_text(d.get('bound_s'), detail.get('tiers_bound'))}")
            forced = f"{fmt_value(d.get('first_forced_bound_s'))} / {fmt_value(d.get('forced_bound_s'))}"
            rows.append((w["name"], side, d.get("rechunk_method") or "—", *time, bound,
                         fmt_value(d.get("first_over_bound"), "{:.1f}x"),
                         fmt_value(d.get("time_over_bound"), "{:.1f}x"),
                         forced, fmt_value(d.get("first_over_forced"), "{:.1f}x"),
                         fmt_value(d.get("time_over_forced"), "{:.1f}x"),
                         _moved_over_forced(d.get("moved_over_forced")),
                         versus))
    return rows


def _tiers_bound_text(bound_s, tiers: dict | None) -> str:
    """Seconds, or which ceiling is missing for a move that happened (``no peer_copy``)."""
    if bound_s is None and tiers and tiers.get("missing"):
        return "no " + ", ".join(tiers["missing"])
    return fmt_value(bound_s)


OUT_OF_CORE_HEAD = ("workload", "side", "rechunk", "first run s", "median s", "bound s (first / median)",
                    "first / bound", "median / bound", "forced bound s (first / median)", "first / forced",
                    "median / forced", "moved / forced (median)", "spillway / tasks_method (first / median)")


def _moved_over_forced(ratios: dict | None) -> str:
    """``D->H 1.4x, H->disk 15x`` for the moves the capacities force (— where none)."""
    from .bounds import SHORT

    parts = [f"{SHORT.get(m, m)} {r:.1f}x" for m, r in (ratios or {}).items() if r is not None]
    return ", ".join(parts) or "—"


def out_of_core_section(workloads: list[dict]) -> list[str]:
    rows = out_of_core_rows(workloads)
    if not rows:
        return []
    described = [f"- {w['name']}: footprint {fmt_bytes(w['out_of_core']['footprint_bytes'])}"
                 + (f", {w['out_of_core']['footprint_over_gpus']:.2f}x the GPUs' memory"
                    if w["out_of_core"].get("footprint_over_gpus") else "")
                 for w in workloads if w.get("out_of_core")]
    return ["", "## Out of core, fresh clusters", "",
            "Each side on a cluster started for it alone: the first run (no warm-up before it) is what a user "
            "meets, then the median of the timed runs. `spillway`: spillway's defaults (user code as "
            "`spillway.local()` runs it); `tasks_method`: the same cluster, the graph built under "
            "`array.rechunk.method: tasks`; `baseline`: plain dask-cuda, the same code (its failure is its result). "
            "The bound is the tiers' (`tiers_bound` of `benchmarks/spillway_bench/bounds.py`): bytes spilled and "
            "restored over the pinned copies, bytes between workers over the peer copy, each divided by the GPUs, "
            "plus disk writes and reads over the disk's rates, at the ceilings of this run. The rechunk column is "
            "how dask built it (collective: spillway's, routed from P2P). The forced bound (`forced_bound`) "
            "prices instead the bytes any placement must move, from each store's peak of held bytes and its tiers' "
            "limits, at the same ceilings; moved / forced is the bytes the run moved over those, per move.",
            "", *described, "",
            "| " + " | ".join(OUT_OF_CORE_HEAD) + " |",
            "| " + " | ".join(["---"] * 3 + ["---:"] * (len(OUT_OF_CORE_HEAD) - 3)) + " |",
            *("| " + " | ".join(r) + " |" for r in rows)]


def previous_section(results: dict) -> list[str]:
    """The rows slower than in the previous result of this machine, and the new ones."""
    prev = results.get("previous")
    if prev is None:
        return []
    out = ["", "## Against the previous result", ""]
    if not prev.get("file"):
        return out + [f"No earlier result of this machine in `{prev.get('searched')}`"
                      + (" (files git tracks)" if prev.get("committed_only") else "") + ": every row is new."]
    out.append(f"Previous: `{prev['file']}` (started {prev.get('started')}"
               + (f", label `{prev['label']}`" if prev.get("label") else "") + "); each row against the newest "
               f"earlier file holding it at these sizes ({prev.get('rows_compared', 0)} rows compared"
               + (", files git tracks" if prev.get("committed_only") else "") + f"). Listed: more than "
               f"{100 * prev.get('threshold', previous.THRESHOLD):.0f}% slower, or failed where it had a time.")
    slower = results.get("slower") or []
    if slower:
        out += ["", "| row | now s | before s | change | compared with |", "| --- | ---: | ---: | ---: | --- |"]
        for r in slower:
            now = "failed" if r["seconds"] is None else fmt_value(r["seconds"])
            change = "—" if r["ratio"] is None else f"{100 * (r['ratio'] - 1):+.0f}%"
            out.append(f"| {previous.describe(r)} | {now} | {fmt_value(r['previous_s'])} | {change} "
                       f"| `{Path(r['file']).name}` |")
    else:
        out += ["", "No row is slower."]
    new = results.get("new") or []
    if new:
        out += ["", "New rows: " + ", ".join(previous.describe(r) for r in new) + "."]
    return out


def _target_value(t: dict) -> str:
    if "faster" in t["target"]:
        return fmt_value(t["value"], "{:.2f}x")
    if "NumPy" in t["target"]:
        return ("relative error " + fmt_value(t["value"], "{:.1e}")) + f"; baseline {t.get('baseline', '—')}"
    return fmt_percent(t["value"])


def _met(t: dict) -> str:
    if t["met"] is None:
        return "not judged (" + ("no value" if t["value"] is None else "targets are the GPU host's") + ")"
    return "yes" if t["met"] else "no"


def target_lines(results: dict) -> list[str]:
    """One line per target and whether it was met, for the terminal."""
    return [f"target {t['name']}: {t['target']}: {_target_value(t)}: {_met(t)}" for t in results.get("targets", [])]


def _spill_section(workloads: list[dict]) -> list[str]:
    """Per workload that spills: each move's bytes, seconds, GB/s per worker and share of
    the pinned ceiling, and how long tasks waited on restores."""
    rows = []
    for w in workloads:
        if not spills(w) and not w.get("spill_throughput"):
            continue
        t = w.get("spill_throughput")
        wait = fmt_value(w.get("restore_wait_s"), "{:.3f} s")
        if t:
            for label, moves, waited in (("spillway", t, wait),
                                         ("spillway, persisting inputs", w.get("persist_spill_throughput") or {}, "—")):
                for move, m in moves.items():
                    if m["bytes"] or m["seconds"]:
                        rows.append(f"| {w['name']} | {label} | {move.replace('_to_', ' -> ')} "
                                    f"| {fmt_bytes(m['bytes'])} | {fmt_value(m['seconds'])} "
                                    f"| {fmt_value(m['gbps_per_worker'], '{:.1f}')} | {_of_ceiling(m)} "
                                    f"| {waited} |")
        else:
            rows.append(f"| {w['name']} | spillway | {fmt_bytes(w.get('bytes_spilled'))} spilled "
                        f"| — | — | — | — | not measured: no tiered store on these workers |")
        if w.get("baseline_spill_throughput"):
            rows.append(f"| {w['name']} | baseline | {fmt_bytes(w.get('baseline_bytes_spilled'))} spilled | — | — "
                        f"| — | — | {w['baseline_spill_throughput']} |")
    if not rows:
        return []
    return ["", "## Spill throughput", "",
            "Bytes and seconds per timed run (median), summed over workers; GB/s per worker is bytes over "
            "the seconds the workers spent copying; the ceiling is the pinned copy of the same run for "
            "device <-> host moves, and the disk tier's fsync'd write and uncached read for disk moves "
            "(writes land in the page cache first, so host -> disk can pass its ceiling).", "",
            "| workload | side | move | bytes | seconds | GB/s per worker | of ceiling "
            "| tasks waited on restores |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |", *rows]


def _bound_section(workloads: list[dict]) -> list[str]:
    """Per workload that moved data between tiers: bytes each way, the copy bound at the
    rates of the same run, the median time and their ratio (spillway; the baseline's
    bound from its counted bytes)."""
    rows = []
    for w in workloads:
        b = w.get("copy_bound")
        if not b:
            continue
        m = {k: v["bytes"] for k, v in b["moves"].items()}
        disk = (f"{fmt_bytes(m.get('host_to_disk'))} / {fmt_bytes(m.get('disk_to_host'))}"
                if m.get("host_to_disk") or m.get("disk_to_host") else "—")
        bound = ("no " + ", ".join(b["missing"])) if b["missing"] else fmt_value(b["bound_s"])
        base = w.get("baseline_copy_bound") or {}
        rows.append(f"| {w['name']} | {fmt_bytes(m.get('device_to_host'))} / {fmt_bytes(m.get('host_to_device'))} "
                    f"| {disk} | {bound} | {fmt_value(w['spillway_s'])} | {fmt_value(b.get('ratio'), '{:.1f}x')} "
                    f"| {fmt_value(base.get('bound_s'))} | {fmt_value(w['baseline_s'])} "
                    f"| {fmt_value(base.get('ratio'), '{:.1f}x')} |")
    if not rows:
        return []
    return ["", "## Copy bound", "",
            "Bytes each way per timed run (median, summed over workers) over the rates of the same run: "
            "device <-> host at the pinned copy ceilings, one link per GPU; host <-> disk at the disk tier's "
            "fsync'd write and uncached read (the page cache can beat them). The moves are added up; x bound "
            "is the median time over the bound.", "",
            "| workload | D->H / H->D | disk W / R | bound s | spillway s | x bound | baseline bound s "
            "| baseline s | baseline x bound |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", *rows]


def _of_ceiling(move: dict) -> str:
    if move.get("ratio_to_ceiling") is None:
        return "—"
    return f"{fmt_percent(move['ratio_to_ceiling'])} of {move['ceiling']}"


def _tiers_section(workloads: list[dict]) -> list[str]:
    """Workloads with their inputs over the tiers or a checked result (B3)."""
    rows = []
    for w in workloads:
        r, v = w.get("resident_after_persist"), w.get("verify")
        if not v and not (r and (r.get("host") or r.get("disk"))):
            continue
        tiers = " / ".join(fmt_bytes((r or {}).get(t)) for t in ("device", "host", "disk"))
        check = "—" if not v else (f"{'OK' if v['ok'] else 'FAILED'}: {v['rel_error']:.1e} "
                                   f"(reference in {v['reference_s']:.0f} s)")
        rows.append(f"| {w['name']} | {fmt_value(w.get('persist_s'))} | {fmt_value(w.get('spillway_s'))} "
                    f"| {tiers} | {check} |")
    if not rows:
        return []
    return ["", "## Inputs over the tiers", "",
            "| workload | persist s | compute s | device / host / disk after persist | check against NumPy float64 |",
            "| --- | ---: | ---: | ---: | --- |", *rows]


def bounds_section(results: dict) -> list[str]:
    """Each workload's time against its compute and copy bounds (:mod:`.bounds`)."""
    rows = []
    for w in results["workloads"]:
        b = w.get("bound")
        if not b:
            continue
        c = b.get("compute") or {}
        rows.append(f"| {w['name']} | {fmt_value(w['spillway_s'])} | {fmt_value(c.get('flops_s'), '{:.4f}')} | "
                    f"{fmt_value(c.get('hbm_s'), '{:.4f}')} | {fmt_value(b.get('transfer_s'), '{:.4f}')} | "
                    f"{fmt_value(b.get('copy_s'), '{:.4f}')} | {fmt_value(b.get('bound_s'), '{:.4f}')} | "
                    f"{fmt_value(b.get('ratio'), '{:.1f}x')} |")
    if not rows:
        return []
    return ["", "## Bounds", "",
            "The least time the ceilings of this run allow: the compute bound (FP64 GEMM rate for the "
            "arithmetic, HBM copy rate for the least memory traffic, spread over the GPUs) and the "
            "copy bound (bytes between workers over each GPU's peer link, plus spills at the pinned "
            "and disk rates); the bound is the larger (`benchmarks/spillway_bench/bounds.py`).", "",
            "| workload | spillway s | arithmetic s | memory s | between workers s | copy s | bound s | time / bound |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", *rows]


def short_table(results: dict) -> str:
    """The few columns printed last on the terminal."""
    rows = [("workload", "spillway s", "baseline s", "speedup", "tasks (spillway/baseline)", "xfer GB/s", "of peer",
             "bound s (compute/copy)", "x bound")]
    for w in results["workloads"]:
        errors = [s for s in SIDES if (w.get(s) or {}).get("error")]
        expected = (w.get("baseline") or {}).get("expected_failure") and errors == ["baseline"]
        rows.append((
            w["name"], fmt_value(w["spillway_s"]), fmt_value(w["baseline_s"]),
            ("baseline failed (expected)" if expected else "failed: " + ",".join(errors) if errors else
             "no baseline" if w.get("baseline_skipped") else fmt_value(w["speedup"], "{:.2f}x")),
            f"{fmt_value((w.get('spillway') or {}).get('tasks'), '{:,}')}/"
            f"{fmt_value((w.get('baseline') or {}).get('tasks'), '{:,}')}",
            fmt_value(w["transfer_gbps_median"], "{:.1f}"), fmt_percent(w["transfer_ratio_to_peer_copy"]),
            _bound_text(w.get("bound")),
            fmt_value((w.get("bound") or {}).get("ratio") or w.get("time_over_copy_bound"), "{:.1f}x"),
        ))
    table = columns(rows)
    ooc = out_of_core_rows(results["workloads"])
    if ooc:
        table += "\n\nout of core, a fresh cluster per side:\n" + columns([OUT_OF_CORE_HEAD, *ooc], left=(0, 1, 2))
    return table


def _bound_text(bound: dict | None) -> str:
    """``bound (compute / copy)`` in seconds, ``—`` where there is none."""
    if not bound or bound.get("bound_s") is None:
        return "—"
    compute = (bound.get("compute") or {}).get("bound_s")
    return (f"{bound['bound_s']:.3f} ({fmt_value(compute, '{:.3f}')}/"
            f"{fmt_value(bound.get('copy_s'), '{:.3f}')})")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    draw(results, *axes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw(results: dict, ax_t, ax_b) -> None:
    """Time per workload (spillway, the out-of-core rows' ``tasks_method`` side and the
    baseline, with the copy bound, first runs and tiers' bounds marked) and worker-to-worker
    bandwidth (p25, median, p75) against the peer copy; the PNG's and a notebook's figure
    (:mod:`.figure`)."""
    import numpy as np

    ws = results["workloads"]
    names = [w["name"] for w in ws]
    x = np.arange(len(ws))
    drawn, width = bars(ws)
    for offset, side in drawn:
        ax_t.bar(x + offset, [w.get(f"{side}_s") or 0 for w in ws], width=width, label=side)
    bounded = [(i, w["copy_bound_s"]) for i, w in enumerate(ws) if w.get("copy_bound_s") and not w.get("out_of_core")]
    if bounded:
        ax_t.scatter([i + drawn[0][0] for i, _ in bounded], [b for _, b in bounded], marker="_", s=250,
                     color="black", zorder=3, label="spillway's copy bound")
    first_marks(ax_t, ws, drawn)
    for i, w in enumerate(ws):
        if w.get("speedup"):
            top = max(w.get("spillway_s") or 0, w.get("baseline_s") or 0)
            ax_t.annotate(f"{w['speedup']:.2f}x", (i, top), ha="center", va="bottom", fontsize=8)
    ax_t.set_xticks(x, names)
    ax_t.set_ylabel("wall time, median (s)")
    if any(w.get("spillway_s") for w in ws):
        ax_t.set_yscale("log")
    ax_t.set_title("time per workload (lower is better)")
    ax_t.legend(fontsize=8)
    for offset, side in drawn:
        med, lo, hi = (np.array([(w.get(side) or {}).get(f"transfer_gbps_{q}") or 0 for w in ws])
                       for q in ("median", "p25", "p75"))
        ax_b.bar(x + offset, med, width=width, label=side,
                 yerr=np.vstack([np.maximum(med - lo, 0), np.maximum(hi - med, 0)]), capsize=3)
    peer = (results.get("ceilings") or {}).get("peer_copy")
    if peer:
        ax_b.axhline(peer, color="black", linestyle="--", linewidth=1, label=f"peer copy {peer:.0f} GB/s")
    ax_b.set_xticks(x, names)
    ax_b.set_ylabel("worker-to-worker GB/s (p25, median, p75)")
    ax_b.set_title("transfer bandwidth")
    ax_b.legend(fontsize=8)
    label = f", {results['label']}" if results.get("label") else ""
    ax_t.figure.suptitle(f"spillway bench on {(results.get('machine') or {}).get('name', '')} "
                         f"({results.get('sizes', '')} sizes{label})")


def bars(ws: list[dict]) -> tuple[list[tuple[float, str]], float]:
    """``([(offset, side), ...], width)`` of the bars per workload: spillway, then
    ``tasks_method`` where an out-of-core row ran it, then the baseline where it ran (a run
    with --no-baseline draws no empty baseline bars)."""
    sides = ["spillway"]
    if any(w.get("tasks_method_s") or (w.get("out_of_core") or {}).get("sides", {}).get("tasks_method") for w in ws):
        sides.append("tasks_method")
    if any(w.get("baseline_s") for w in ws):
        sides.append("baseline")
    width = 0.8 / len(sides)
    return [((i - (len(sides) - 1) / 2) * width, side) for i, side in enumerate(sides)], width


def first_marks(ax, ws: list[dict], drawn) -> None:
    """On the out-of-core rows: each side's first run on its fresh cluster (a ring) and the
    tiers' bound of its median run (a bar)."""
    firsts, limits = [], []
    for i, w in enumerate(ws):
        sides = (w.get("out_of_core") or {}).get("sides") or {}
        for offset, side in drawn:
            d = sides.get(side) or {}
            if d.get("first_s"):
                firsts.append((i + offset, d["first_s"]))
            if d.get("bound_s"):
                limits.append((i + offset, d["bound_s"]))
    if firsts:
        ax.scatter(*zip(*firsts), marker="o", facecolors="none", edgecolors="black", zorder=3,
                   label="first run, fresh cluster")
    if limits:
        ax.scatter(*zip(*limits), marker="_", s=150, color="dimgray", zorder=3, label="tiers' bound (median run)")
