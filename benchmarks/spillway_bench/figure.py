"""The benchmark's results in one figure for a notebook: time per workload (spillway, the
out-of-core rows' ``tasks_method`` side and the baseline, with those rows' first runs and
tiers' bounds marked) and worker-to-worker bandwidth against the peer-copy ceiling."""

from __future__ import annotations

from spillway.run.figures import load, new_figure

from .render import bars, first_marks


def plot(source, *, figsize=None):
    """One figure of ``spillway bench`` results (the dict or its JSON file): time per
    workload and transfer bandwidth. Returns a matplotlib Figure, which Jupyter shows."""
    data = load(source, "benchmark results")
    if "workloads" not in data:
        raise ValueError("plot: the data is not benchmark results (workloads)")
    return _bench_figure(data, figsize or (12, 4.5))


def _bench_figure(results: dict, figsize):
    import numpy as np

    fig, (ax_t, ax_b) = new_figure(figsize, 2)
    ws = results["workloads"]
    names = [w["name"] for w in ws]
    x = np.arange(len(ws))
    drawn, width = bars(ws)
    for offset, side in drawn:
        ax_t.bar(x + offset, [w.get(f"{side}_s") or 0 for w in ws], width=width, label=side)
    first_marks(ax_t, ws, drawn)
    for i, w in enumerate(ws):
        if w.get("speedup"):
            top = max(w.get("spillway_s") or 0, w.get("baseline_s") or 0)
            ax_t.annotate(f"{w['speedup']:.2f}x", (i, top), ha="center", va="bottom", fontsize=8)
    ax_t.set_xticks(x, names)
    ax_t.set_ylabel("wall time, median (s)")
    ax_t.set_title("time per workload (lower is better)")
    ax_t.legend(fontsize=8)
    for offset, side in drawn:
        ax_b.bar(x + offset, [(w.get(side) or {}).get("transfer_gbps_median") or 0 for w in ws], width=width,
                 label=side)
    peer = (results.get("ceilings") or {}).get("peer_copy")
    if peer:
        ax_b.axhline(peer, color="black", linestyle="--", linewidth=1, label=f"peer copy {peer:.0f} GB/s")
    ax_b.set_xticks(x, names)
    ax_b.set_ylabel("worker-to-worker GB/s, median")
    ax_b.set_title("transfer bandwidth")
    ax_b.legend(fontsize=8)
    machine = (results.get("machine") or {}).get("name", "")
    fig.suptitle(f"spillway bench on {machine} ({results.get('sizes', '')} sizes)")
    return fig
