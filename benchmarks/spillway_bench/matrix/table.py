"""The matrix's table, ``<machine>-<date>-ooc-matrix.{json,md,png}``, merged slice by slice
(:func:`merge_files` joins slices fetched from separate device calls); each row keeps the
copy ceilings of its own run.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import numpy as np

from ..formatting import fmt_bytes, fmt_value
from ..report import stem
from .cases import cases

SUFFIX = "ooc-matrix"


def table_stem(machine: str, when: datetime | None = None) -> str:
    return stem(machine, when, SUFFIX, day=True)


def merged_rows(*row_lists: list[dict]) -> list[dict]:
    """Rows by case, a later list's row replacing an earlier one's, in the catalogue's order."""
    by_case: dict[str, dict] = {}
    for rows in row_lists:
        by_case.update({r["case"]: r for r in rows})
    order = {c.id: i for i, c in enumerate(cases())}
    return sorted(by_case.values(), key=lambda r: (order.get(r["case"], len(order)), r["case"]))


def merged_slices(*lists: list[dict]) -> list[dict]:
    """Slice records by (name, start), a later record of the same run replacing an earlier
    one (a slice rewrites its record after every case)."""
    out: dict[tuple, dict] = {}
    for records in lists:
        out.update({(s.get("name"), s.get("started")): s for s in records})
    return sorted(out.values(), key=lambda s: s.get("started") or "")


def write_table(rows: list[dict], out_dir: Path, machine: str, *, when: datetime | None = None,
                merge: bool = True, slices: list[dict] | None = None) -> dict[str, Path]:
    """``<machine>-<date>-ooc-matrix.{json,md,png}`` in ``out_dir``; rows of an earlier
    slice in the same file are kept unless this run has the same case. ``slices`` (what
    each run was: its cases, start and end) are added to the file's list."""
    from .. import report

    out_dir = Path(out_dir)
    name = table_stem(machine, when)
    path = out_dir / f"{name}.json"
    earlier = json.loads(path.read_text()) if merge and path.exists() else {}
    results = {"machine": machine, "cases": merged_rows(earlier.get("cases", []), rows),
               "slices": merged_slices(earlier.get("slices", []), slices or [])}
    return report.write(results, out_dir, name, render=markdown, draw=plot)


def merge_files(paths: list[Path], out_dir: Path) -> dict[str, Path]:
    """Join matrix JSON files of one machine (slices from separate device calls) into
    ``out_dir``'s file of the first one's day; rows of later files (by the time their
    slice finished) replace earlier rows of the same case."""
    loaded = [json.loads(Path(p).read_text()) for p in paths]
    if not loaded:
        raise ValueError("no matrix files to merge")
    machines = {d["machine"] for d in loaded}
    if len(machines) > 1:
        raise ValueError(f"matrix files of different machines: {', '.join(sorted(machines))}")

    def finished(d):
        return max((s.get("finished") or "" for s in d.get("slices", [])), default="")

    loaded.sort(key=finished)
    first = min((s["started"] for d in loaded for s in d.get("slices", []) if s.get("started")), default=None)
    when = datetime.fromisoformat(first) if first else None
    rows = [d["cases"] for d in loaded]
    slices = merged_slices(*[d.get("slices", []) for d in loaded])
    out_dir = Path(out_dir)
    target = out_dir / f"{table_stem(machines.pop(), when)}.json"
    existing = json.loads(target.read_text()) if target.exists() and target not in map(Path, paths) else None
    if existing:
        rows.insert(0, existing["cases"])
        slices = merged_slices(existing.get("slices", []), slices)
    return write_table(merged_rows(*rows), out_dir, loaded[0]["machine"], when=when, merge=False, slices=slices)


def _bound_cells(r: dict) -> tuple[str, str, str, str]:
    """device -> host / host -> device, disk write / read, bound s, time over bound."""
    moves = r.get("moves") or {}
    pcie = f"{fmt_bytes(moves.get('device_to_host'))} / {fmt_bytes(moves.get('host_to_device'))}" if moves else "—"
    disk = (f"{fmt_bytes(moves.get('host_to_disk'))} / {fmt_bytes(moves.get('disk_to_host'))}"
            if moves.get("host_to_disk") or moves.get("disk_to_host") else "—")
    b = r.get("copy_bound") or {}
    bound = fmt_value(b.get("bound_s"), "{:.2f}")
    if b.get("missing"):
        bound = "no " + ", ".join(b["missing"])
    ratio = fmt_value(b.get("ratio"), "{:.1f}x")
    return pcie, disk, bound, ratio


def _host_cells(r: dict) -> str:
    """host peak / min available (flagged under the headroom) | OOM kills."""
    peak, low = r.get("host_peak_used_bytes"), r.get("host_min_available_bytes")
    host = f"{fmt_bytes(peak)} / {fmt_bytes(low)}" if peak is not None and low is not None else "—"
    if r.get("under_headroom"):
        host += f" **under {fmt_bytes(r.get('host_headroom_bytes'))}**"
    kills = r.get("oom_kills", "unknown")
    oom = kills if isinstance(kills, str) else ("none" if not kills else f"**{len(kills)}**")
    return f"{host} | {oom}"


def markdown(results: dict) -> str:
    rows = results["cases"]
    done = sum(1 for r in rows if r["ok"])
    refused = sum(1 for r in rows if r["refused"])
    lines = [f"# spillway out-of-core matrix: {results['machine']}", "",
             f"{len(rows)} cases: {done} gave NumPy's answer, {refused} refused by admission, "
             f"{len(rows) - done - refused} failed. Footprint is the projected one; device is the GPUs' memory "
             "(or the CPU stand-in). Moved: bytes each way during the computation, summed over workers. "
             "Copy bound: those bytes over the pinned copy rates (per GPU) and the disk rates measured in "
             "the same run, added up; x bound is the wall time over it. Host: the most host memory in use "
             "(MemTotal - MemAvailable, every 0.5 s) / the lowest MemAvailable, **under** where it went below "
             "the headroom the store keeps; OOM: the kernel's OOM kills during the case (unknown: dmesg "
             "could not be read).", "",
             "| case | path | footprint | device | x device | ok | relative error | wall s | spilled "
             "| moved D->H / H->D | disk W / R | copy bound s | x bound | host peak / min avail | OOM | error |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- "
             "| --- |"]
    for r in rows:
        ratio = (f"{r['footprint_bytes'] / r['device_bytes']:.2f}"
                 if r.get("footprint_bytes") and r.get("device_bytes") else "—")
        status = "yes" if r["ok"] else "refused" if r["refused"] else "no"
        err = fmt_value(r["rel_error"], "{:.1e}")
        wall = fmt_value(r["wall_s"], "{:.2f}")
        pcie, disk, bound, x_bound = _bound_cells(r)
        lines.append(f"| {r['workflow']} | {r['path']} | {fmt_bytes(r['footprint_bytes'])} "
                     f"| {fmt_bytes(r['device_bytes'])} | {ratio} | {status} | {err} | {wall} "
                     f"| {fmt_bytes(r['spilled_bytes'])} | {pcie} | {disk} | {bound} | {x_bound} "
                     f"| {_host_cells(r)} | {(r['error'] or '').replace('|', '/')} |")
    ceil = [(r["case"], r.get("ceilings")) for r in rows if r.get("ceilings")]
    if ceil:
        lines += ["", "Copy ceilings of the runs (GB/s): "
                  + "; ".join(sorted({", ".join(f"{k} {v:.1f}" for k, v in sorted(c.items())) for _, c in ceil}))]
    if results.get("slices"):
        lines += ["", "Slices: " + "; ".join(f"{s.get('name', '?')} ({len(s.get('cases', []))} cases, "
                                             f"{s.get('started', '?')} to {s.get('finished', '?')})"
                                             for s in results["slices"])]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    """Wall time per case, coloured by path, with its copy bound as a black tick; failed
    and refused cases marked at zero."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["cases"]
    colours = {"cli": "tab:blue", "notebook": "tab:orange", "user-code": "tab:green"}
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(rows) + 2), 4.5))
    x = np.arange(len(rows))
    ax.bar(x, [r["wall_s"] or 0 for r in rows], color=[colours.get(r["path"], "grey") for r in rows])
    bounds = [((r.get("copy_bound") or {}).get("bound_s")) for r in rows]
    bx = [i for i, b in enumerate(bounds) if b]
    if bx:
        ax.scatter(bx, [bounds[i] for i in bx], marker="_", s=300, color="black", zorder=3, label="copy bound")
    for i, r in enumerate(rows):
        if not r["ok"]:
            ax.annotate("refused" if r["refused"] else "failed", (i, 0), rotation=90, ha="center", va="bottom",
                        fontsize=7, color="red")
        # the host: an OOM kill, or MemAvailable under the store's headroom, above the bar
        kills = r.get("oom_kills")
        flag = "OOM kill" if isinstance(kills, list) and kills else "low host memory" if r.get("under_headroom") else None
        if flag:
            ax.annotate(flag, (i, r["wall_s"] or 0), rotation=90, ha="center", va="bottom", fontsize=7,
                        color="darkred", fontweight="bold")
    ax.set_xticks(x, [r["case"] for r in rows], rotation=75, ha="right", fontsize=7)
    ax.set_ylabel("wall time (s)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    labels = list(colours)
    if bx:
        handles.append(plt.Line2D([], [], color="black", marker="_", linestyle="", markersize=12))
        labels.append("copy bound")
    ax.legend(handles, labels, fontsize=8)
    ax.set_title(f"out-of-core matrix on {results['machine']}: wall time per case")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
