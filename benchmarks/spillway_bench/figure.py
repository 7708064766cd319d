"""The benchmark's results in one figure for a notebook (:func:`.render.draw`, the PNG's)."""

from __future__ import annotations

from spillway.run.figures import load, new_figure

from .render import draw


def plot(source, *, figsize=None):
    """One figure of ``spillway bench`` results (the dict or its JSON file): time per
    workload and transfer bandwidth. Returns a matplotlib Figure, which Jupyter shows."""
    data = load(source, "benchmark results")
    if "workloads" not in data:
        raise ValueError("plot: the data is not benchmark results (workloads)")
    fig, axes = new_figure(figsize or (12, 4.5), 2)
    draw(data, *axes)
    return fig
