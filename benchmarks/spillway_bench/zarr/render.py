"""How a Zarr bench run's results read: the terminal table, markdown and the PNG."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spillway.options.sizes import format_bytes

from ..formatting import columns, fmt_percent, fmt_shape, fmt_value, gpu_list, stack_line
from .prepare import CACHED_TARGET_GBPS, MEASURES

def _rows(results: dict) -> list[list[str]]:
    rows = [["store", "", "s (median)", "GB/s", "stored GB/s", "ceiling", "of ceiling", "bits"]]
    for store, st in results["stores"].items():
        for name in MEASURES:
            m = st[name]
            ceiling = "—" if m["ceiling_gbps"] is None else f"{m['ceiling']} {m['ceiling_gbps']:.1f}"
            ratio = fmt_percent(m["ratio_to_ceiling"])
            rows.append([store, name.replace("_", " "), f"{m['seconds']:.3f}", f"{m['gbps']:.2f}",
                         f"{m['stored_gbps']:.2f}", ceiling, ratio, "equal" if m["bits_equal"] else "DIFFER"])
    return rows


def _decode_lines(results: dict) -> list[str]:
    lines = []
    for store, st in results["stores"].items():
        for where, d in st.get("decode", {}).items():
            if d["frames"]:
                rate = fmt_value(d["gbps_per_worker"], "{:.2f} GB/s per worker")
                lines.append(f"{store}: decoded on the {where}: {format_bytes(d['bytes'])} in {d['frames']} frames, "
                             f"{d['seconds']:.2f} s, {rate} ({d['workers']} workers)")
        if store != "uncompressed" and st.get("ratio"):
            lines.append(f"{store}: {format_bytes(st['stored_bytes'])} stored, ratio {st['ratio']:.2f}")
    return lines


def _value(t: dict) -> str:
    if t["value"] is None:
        return "—"
    return f"{t['value']:.2f} GB/s" if t["unit"] == "GB/s" else f"{100 * t['value']:.0f}%"


def short_table(results: dict) -> str:
    rows = _rows(results)
    lines = [columns(rows, left=(0, 1, 5))]
    lines += _decode_lines(results)
    for t in results["targets"]:
        met = "not judged (CPU workers)" if t["met"] is None else ("met" if t["met"] else "NOT met")
        lines.append(f"target: {t['target']}: {_value(t)}, {met}")
    return "\n".join(lines)


def markdown(results: dict) -> str:
    m = results["machine"]
    gpus = gpu_list(m)
    rows = _rows(results)
    inner = fmt_shape(results["zstd_inner_chunks"])
    lines = [
        f"# spillway bench --zarr: {m['name']}",
        "",
        f"- started {results['started']}, finished {results['finished']}",
        *([f"- label `{results['label']}`"] if results.get("label") else []),
        f"- stores: {format_bytes(results['bytes'])} {results['dtype']} {fmt_shape(results['shape'])}, "
        f"chunks {fmt_shape(results['chunks'])}: `uncompressed` (spillway's output path), and `zstd` "
        f"(shards of that size, inner chunks {inner} each its own zstd frame, written by zarr); in "
        f"`{results['directory']}`; sizes `{results['sizes']}`, {results['runs']} runs of each read, median shown",
        f"- workers: {results['cluster']['n_workers']} {results['workers']}; GPUs: {gpus}; "
        f"driver {m['driver_version']}, CUDA {m['cuda_driver_version']}",
        f"- chunk I/O: {'; '.join(results['io_path'])}",
        f"- CPU: {m['cpu']}, {m['cores']} cores, {format_bytes(m['memory_total'])}",
        stack_line(m),
        "",
        "Write: until the files are on disk (fsync). Cold read: the store's pages dropped first. Cached read: "
        "the store in the page cache. GB/s are 10^9 array (decoded) bytes per second; stored GB/s count the bytes "
        "in the files, and the disk ceilings are judged on those. Every read is checked bit for bit against what "
        "was written.",
        "",
        "| " + " | ".join(rows[0]) + " |",
        "| --- | --- |" + " ---: |" * 3 + " --- | ---: | --- |",
        *("| " + " | ".join(r) + " |" for r in rows[1:]),
        "",
        *(f"- {line}" for line in _decode_lines(results)),
        "",
        "## Targets",
        "",
        "| target | value | met |",
        "| --- | ---: | --- |",
    ]
    for t in results["targets"]:
        lines.append(f"| {t['target']} | {_value(t)} | "
                     f"{'not judged (CPU workers)' if t['met'] is None else 'yes' if t['met'] else 'no'} |")
    lines += ["", "## Ceilings", "", "| ceiling | GB/s |", "| --- | ---: |"]
    lines += [f"| {k} | {v:.1f} |" for k, v in results["ceilings"].items()]
    lines += [f"| {k} | skipped: {why} |" for k, why in results["ceilings_skipped"].items()]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(store, n) for store in results["stores"] for n in MEASURES]
    names = [f"{store}\n{n.replace('_', ' ')}" for store, n in bars]
    measured = [results["stores"][s][n]["gbps"] for s, n in bars]
    limits = [results["stores"][s][n]["ceiling_gbps"] for s, n in bars]
    x = np.arange(len(bars))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ax.bar(x - 0.2, measured, width=0.4, label="spillway (array bytes)")
    ax.bar(x + 0.2, [v or 0 for v in limits], width=0.4, label="ceiling", color="lightgray", edgecolor="gray")
    for i, (s, n) in enumerate(bars):
        ratio = results["stores"][s][n]["ratio_to_ceiling"]
        if ratio is not None:
            ax.annotate(f"{100 * ratio:.0f}%", (i - 0.2, measured[i]), ha="center", va="bottom", fontsize=8)
        if limits[i]:
            ax.annotate(results["stores"][s][n]["ceiling"], (i + 0.2, limits[i]), ha="center", va="bottom",
                        fontsize=7)
    if results["workers"] == "gpu":
        ax.axhline(CACHED_TARGET_GBPS, color="black", linestyle="--", linewidth=1,
                   label=f"cached-read target {CACHED_TARGET_GBPS:.0f} GB/s")
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel("GB/s")
    ax.legend()
    label = f", {results['label']}" if results.get("label") else ""
    ax.set_title(f"Zarr {format_bytes(results['bytes'])} on {results['machine']['name']} "
                 f"({results['sizes']}{label})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
