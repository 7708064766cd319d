"""Matplotlib figures that show themselves in Jupyter, and the axis helpers the run report's
and the benchmark's figures share."""

from __future__ import annotations

import functools
import io
import json
import os
from collections.abc import Mapping
from pathlib import Path


@functools.cache
def figure_class():
    # matplotlib is imported on the first plot, not with the package
    from matplotlib.figure import Figure

    class PlotFigure(Figure):
        """Shown as an image when it is a cell's value, whether or not pyplot's inline
        backend (which registers Jupyter's figure formatter) was ever loaded."""

        def _repr_png_(self):
            buffer = io.BytesIO()
            self.savefig(buffer, format="png", dpi=100)
            return buffer.getvalue()

    return PlotFigure


def new_figure(figsize, ncols):
    # A Figure of its own (not pyplot's): nothing is drawn twice in Jupyter, and nothing
    # is left open in a long-running kernel.
    fig = figure_class()(figsize=figsize, layout="constrained")
    return fig, fig.subplots(1, ncols)


def short_address(address: str) -> str:
    return address.split("://", 1)[-1]


def decimal_unit(*values) -> tuple[float, str]:
    """The decimal unit that keeps the largest of ``values`` readable."""
    top = max([v or 0 for v in values] or [0])
    for scale, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if top >= scale:
            return scale, name
    return 1.0, "bytes"


def decimal_bytes(n) -> str:
    """``n`` bytes in the decimal unit of :func:`decimal_unit`, so a figure's title says its
    sizes in the unit its axes use."""
    scale, unit = decimal_unit(n)
    return f"{(n or 0) / scale:.3g} {unit}" if scale > 1 else f"{int(n or 0)} bytes"


def load(source, what: str) -> dict:
    """The dict to draw: ``source`` itself, or the JSON file it names (``what`` names the
    data expected, for the error)."""
    if isinstance(source, (str, os.PathLike)):
        with Path(source).expanduser().open() as f:
            return json.load(f)
    if isinstance(source, Mapping):
        return dict(source)
    raise TypeError(f"plot: expected {what} or its JSON file, got {type(source).__name__}")
