"""How the bench's results read: the markdown report, the short table printed last, the
target lines and the PNG plot (:mod:`.report` builds the results they render)."""

from __future__ import annotations

from pathlib import Path

from spillway.cluster.info import topology_lines
from spillway.cluster.sizes import format_bytes

from . import timeline
from .formatting import columns, fmt_bytes, fmt_percent, fmt_value, gpu_list, stack_line

SIDES = ("spillway", "baseline")

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
    lines += _spill_section(results["workloads"])
    lines += _bound_section(results["workloads"])
    lines += bounds_section(results)
    lines += _tiers_section(results["workloads"])
    lines += timeline.markdown_section(results)
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
            "and disk rates); the bound is the larger (`spillway/bench/bounds.py`).", "",
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
    return columns(rows)


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
    import numpy as np

    ws = results["workloads"]
    names = [w["name"] for w in ws]
    x = np.arange(len(ws))
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(12, 4.5))
    # a run without the baseline (--no-baseline) draws no empty baseline bars
    drawn = [(offset, side) for offset, side in ((-0.2, "spillway"), (0.2, "baseline"))
             if side == "spillway" or any(w["baseline_s"] for w in ws)]
    for offset, side in drawn:
        values = [w[f"{side}_s"] or 0 for w in ws]
        ax_t.bar(x + offset, values, width=0.4, label=side)
    bounded = [(i, w["copy_bound_s"]) for i, w in enumerate(ws) if w.get("copy_bound_s")]
    if bounded:
        ax_t.scatter([i - 0.2 for i, _ in bounded], [b for _, b in bounded], marker="_", s=250, color="black",
                     zorder=3, label="spillway's copy bound")
    for i, w in enumerate(ws):
        if w["speedup"]:
            top = max(w["spillway_s"] or 0, w["baseline_s"] or 0)
            ax_t.annotate(f"{w['speedup']:.2f}x", (i, top), ha="center", va="bottom", fontsize=8)
    ax_t.set_xticks(x, names)
    ax_t.set_ylabel("wall time, median (s)")
    if any(w["spillway_s"] for w in ws):
        ax_t.set_yscale("log")
    ax_t.set_title("time per workload (lower is better)")
    ax_t.legend()

    for offset, side in drawn:
        med = np.array([(w.get(side) or {}).get("transfer_gbps_median") or 0 for w in ws])
        lo = np.array([(w.get(side) or {}).get("transfer_gbps_p25") or 0 for w in ws])
        hi = np.array([(w.get(side) or {}).get("transfer_gbps_p75") or 0 for w in ws])
        ax_b.bar(x + offset, med, width=0.4, label=side,
                 yerr=np.vstack([np.maximum(med - lo, 0), np.maximum(hi - med, 0)]), capsize=3)
    peer = results["ceilings"].get("peer_copy")
    if peer:
        ax_b.axhline(peer, color="black", linestyle="--", linewidth=1, label=f"peer copy {peer:.0f} GB/s")
    ax_b.set_xticks(x, names)
    ax_b.set_ylabel("worker-to-worker GB/s (p25, median, p75)")
    ax_b.set_title("transfer bandwidth")
    ax_b.legend()
    label = f", {results['label']}" if results.get("label") else ""
    fig.suptitle(f"spillway bench on {results['machine']['name']} ({results['sizes']} sizes{label})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
