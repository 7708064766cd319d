"""Combining the runs of several worker counts (no GPU needed), and how the combination
reads: terminal tables, markdown and a PNG."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spillway.options.errors import ParamError

from .. import report
from ..formatting import columns, fmt_bytes, fmt_shape, fmt_value
from .sizes import BASE_WORKERS, LEFT_OUT, MODES, STUDY

def machine_kind(machine: Mapping[str, Any]) -> str:
    """What runs must share to be compared: the worker kind and the GPU model (the host's
    GPU count differs between the 2-, 4- and 8-GPU hosts)."""
    gpus = machine.get("gpus") or []
    if machine.get("workers") == "gpu" and gpus:
        return f"gpu {gpus[0]['name']}"
    return "cpu"


def load_runs(files: Sequence[str | Path]) -> tuple[str, list[dict]]:
    """The study runs in ``files``, fewest workers first, and their common mode; refuses
    files that are not study runs or mix modes, sizes, machine kinds or worker counts."""
    if not files:
        raise ParamError("files: give the JSON files of the study's runs (one per worker count)")
    runs = []
    for f in files:
        path = Path(f)
        try:
            data = json.loads(path.read_text())
            data["scaling"]["workers"], data["scaling"]["modes"], data["workloads"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ParamError(f"file: {str(path)!r} is not a bench-scaling results file ({type(e).__name__}: {e})") from None
        data["_path"] = str(path)
        runs.append(data)
    first = runs[0]
    modes = set(MODES)
    for r in runs:
        modes &= set(r["scaling"]["modes"])
        if not modes:
            raise ParamError(f"mode: {r['_path']} is a {r['scaling']['mode']} run, {first['_path']} is "
                             f"{first['scaling']['mode']}; combine runs of one mode")
        for key, what in (("sizes", "sizes"), ("kind", "machine kind")):
            if r["scaling"][key] != first["scaling"][key]:
                raise ParamError(f"{what}: {r['_path']} has {r['scaling'][key]!r}, {first['_path']} has "
                                 f"{first['scaling'][key]!r}; combine runs of one {what}")
    counts = [r["scaling"]["workers"] for r in runs]
    for c in set(counts):
        if counts.count(c) > 1:
            raise ParamError(f"files: {counts.count(c)} runs on {c} workers; give one run per worker count")
    # a run at the base count serves both modes: the others' mode names the study
    mode = first["scaling"]["mode"] if first["scaling"]["mode"] in modes else next(iter(modes))
    return mode, sorted(runs, key=lambda r: r["scaling"]["workers"])


def efficiency(mode: str, t_ref: float | None, n_ref: int, t: float | None, n: int) -> float | None:
    """Parallel efficiency against the run with the fewest workers: weak t_ref / t,
    strong (t_ref * n_ref) / (t * n)."""
    if not t_ref or not t:
        return None
    return t_ref / t if mode == "weak" else (t_ref * n_ref) / (t * n)


def combine(mode: str, runs: list[dict]) -> dict:
    """Per workload, one row per worker count (fewest first)."""
    names = [n for n in STUDY if any(w["name"] == n for r in runs for w in r["workloads"])]
    table = {}
    for name in names:
        rows = []
        for r in runs:
            w = next((w for w in r["workloads"] if w["name"] == name), None)
            if w is None:
                continue
            n = r["scaling"]["workers"]
            shape = r["scaling"].get("shapes", {}).get(name)
            rows.append({
                "workers": n, "shape": shape, "time_s": w.get("spillway_s"),
                "error": (w.get("spillway") or {}).get("error"),
                "transfer_gbps_p25": w.get("transfer_gbps_p25"),
                "transfer_gbps_median": w.get("transfer_gbps_median"),
                "transfer_gbps_p75": w.get("transfer_gbps_p75"),
                "bytes_moved": w.get("bytes_moved"),
                "data_bytes_per_worker": r["scaling"].get("data_bytes_per_worker", {}).get(name),
                "file": r["_path"],
            })
        ref = rows[0]
        for row in rows:
            row["relative_time"] = (row["time_s"] / ref["time_s"]) if row["time_s"] and ref["time_s"] else None
            row["efficiency"] = efficiency(mode, ref["time_s"], ref["workers"], row["time_s"], row["workers"])
        table[name] = rows
    first = runs[0]
    return {"mode": mode, "sizes": first["scaling"]["sizes"], "kind": first["scaling"]["kind"],
            "workers": [r["scaling"]["workers"] for r in runs], "base_workers": BASE_WORKERS,
            "files": [r["_path"] for r in runs], "workloads": table}


# --- how the combination reads


HEADER = ("workers", "shape", "time s", "rel. time", "efficiency", "xfer GB/s median", "p25 / p75", "moved")


def _cells(row) -> tuple[str, ...]:
    time_s = f"failed: {row['error']}" if row["error"] else fmt_value(row["time_s"])
    return (str(row["workers"]), fmt_shape(row["shape"]), time_s, fmt_value(row["relative_time"], "{:.2f}x"),
            fmt_value(row["efficiency"], "{:.2f}"), fmt_value(row["transfer_gbps_median"], "{:.1f}"),
            f"{fmt_value(row['transfer_gbps_p25'], '{:.1f}')} / {fmt_value(row['transfer_gbps_p75'], '{:.1f}')}",
            fmt_bytes(row["bytes_moved"]))


def text_table(combined: dict) -> str:
    """The tables printed on the terminal, one per workload."""
    out = []
    for name, rows in combined["workloads"].items():
        cells = [HEADER] + [_cells(r) for r in rows]
        out.append(f"{name} ({combined['mode']} scaling)")
        out.append(columns(cells, left=()))
        out.append("")
    return "\n".join(out).rstrip() + "\n"


EFFICIENCY = {"weak": "t(n0) / t(n), data per worker fixed", "strong": "t(n0) * n0 / (t(n) * n), total data fixed"}


def markdown(combined: dict) -> str:
    lines = [f"# spillway bench-scaling: {combined['mode']} scaling, {combined['sizes']} sizes, {combined['kind']}",
             "", f"- workers: {', '.join(map(str, combined['workers']))}; efficiency is "
             f"{EFFICIENCY[combined['mode']]}, n0 the fewest workers here",
             "- time: spillway's side, median of the timed runs; transfers: per-transfer GB/s of 1 MB or more",
             "- runs: " + ", ".join(f"`{f}`" for f in combined["files"]),
             "- left out: " + "; ".join(f"{k}: {v}" for k, v in LEFT_OUT.items())]
    for name, rows in combined["workloads"].items():
        lines += ["", f"## {name}", "", "| " + " | ".join(HEADER) + " |",
                  "| " + " | ".join(["---:"] * len(HEADER)) + " |"]
        lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot(combined: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_e, ax_b) = plt.subplots(1, 3, figsize=(15, 4.5))
    for name, rows in combined["workloads"].items():
        timed = [r for r in rows if r["time_s"]]
        if timed:
            ax_t.plot([r["workers"] for r in timed], [r["time_s"] for r in timed], marker="o", label=name)
            ax_e.plot([r["workers"] for r in timed], [r["efficiency"] for r in timed], marker="o", label=name)
        moved = [r for r in rows if r["transfer_gbps_median"]]
        if moved:
            med = np.array([r["transfer_gbps_median"] for r in moved])
            lo = np.array([r["transfer_gbps_p25"] or m for r, m in zip(moved, med)])
            hi = np.array([r["transfer_gbps_p75"] or m for r, m in zip(moved, med)])
            ax_b.errorbar([r["workers"] for r in moved], med, capsize=3, marker="o", label=name,
                          yerr=np.vstack([np.maximum(med - lo, 0), np.maximum(hi - med, 0)]))
    ticks = combined["workers"]
    for ax, ylabel, title in ((ax_t, "wall time, median (s)", "time"),
                              (ax_e, "parallel efficiency", f"efficiency ({combined['mode']})"),
                              (ax_b, "worker-to-worker GB/s (p25, median, p75)", "transfer bandwidth")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("workers")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    ax_e.axhline(1.0, color="black", linestyle="--", linewidth=1)
    if ax_t.lines:  # strong scaling can span an order of magnitude
        ax_t.set_yscale("log")
    fig.suptitle(f"spillway bench-scaling: {combined['mode']} scaling, {combined['sizes']} sizes, {combined['kind']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_stem(combined: dict) -> str:
    kind = "".join(c if c.isalnum() else "-" for c in combined["kind"].lower()).strip("-")
    # not "-<mode>-n<N>": a glob over the runs' files must not pick the report up
    return f"scaling-{kind}-{combined['sizes']}-{combined['mode']}-workers-{'-'.join(map(str, combined['workers']))}"


def write_report(combined: dict, out_dir: Path) -> dict[str, Path]:
    return report.write(combined, out_dir, report_stem(combined), render=markdown, draw=plot)
