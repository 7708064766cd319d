"""Task progress bars: tqdm's widget in Jupyter, text on stderr or on a given stream
elsewhere; the embedded cluster and the service client draw their runs' progress with them."""

from __future__ import annotations

import os
import sys

#: the width of a bar on a terminal that reports none
FALLBACK_COLUMNS = 80


def progress_bar(label: str, progress=True):
    """A task bar: tqdm's widget in Jupyter and text on stderr elsewhere (``progress`` is
    True), or a text bar on ``progress`` when it is a stream."""
    options = dict(total=0, desc=label, unit="task", leave=True)
    if progress is True:
        if in_notebook():
            from tqdm.auto import tqdm

            return tqdm(**options)
        if not _isatty(sys.stderr):
            # a redirected log gets no bar: tqdm would write a \r update on every tick
            return None
        progress = sys.stderr
    from tqdm import tqdm

    return tqdm(file=progress, **terminal_shape(progress), **options)


def terminal_shape(stream) -> dict:
    """tqdm's size keywords for a bar on ``stream``: the terminal's as it is resized, or a
    fixed width where the terminal reports 0 columns or 0 rows (a pseudo-terminal that
    ``script`` or a CI runner opens without a size), on which tqdm drew no bar at all: it
    hides a bar at or past the terminal's last row."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, ValueError, OSError):
        return {"dynamic_ncols": True}  # no terminal: tqdm's own fallback width
    if size.columns > 0 and size.lines > 0:
        return {"dynamic_ncols": True}
    return {"ncols": FALLBACK_COLUMNS, "nrows": 1 << 10}


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (where bars are widgets)."""
    shell = sys.modules.get("IPython")
    try:
        ip = shell.get_ipython() if shell is not None else None
    except Exception:  # noqa: BLE001
        return False
    return ip is not None and "IPKernelApp" in getattr(ip, "config", {})


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def advance(bar, done: int, total: int, note: str = "") -> None:
    """Move ``bar`` to ``done`` of ``total`` tasks; totals grow as graphs arrive."""
    total = max(total, done)
    if total != bar.total:
        bar.total = total
        container = getattr(bar, "container", None)
        if container is not None:  # the notebook widget keeps its own maximum
            container.children[1].max = total
    bar.n = done
    if note:
        bar.set_postfix_str(note, refresh=False)
    bar.refresh()
