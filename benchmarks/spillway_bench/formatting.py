"""How the bench writes values in its tables and reports, in one place: a value that may
be missing, bytes (the product's :func:`~spillway.options.sizes.format_bytes`), shapes,
aligned terminal columns and the machine lines the reports open with."""

from __future__ import annotations

from collections.abc import Sequence

from spillway.options.sizes import format_bytes

#: what a table shows for a value that is missing
MISSING = "—"


def fmt_value(v, fmt: str = "{:.3f}") -> str:
    """``v`` in ``fmt``, or :data:`MISSING` where it is None."""
    return MISSING if v is None else fmt.format(v)


def fmt_percent(v) -> str:
    return MISSING if v is None else f"{100 * v:.0f}%"


def fmt_bytes(v) -> str:
    """Bytes as dask writes them (``1.50 GiB``), or :data:`MISSING`."""
    return MISSING if v is None else format_bytes(v)


def fmt_shape(shape) -> str:
    """``40000x40000``, or :data:`MISSING` for no shape."""
    return MISSING if not shape else "x".join(map(str, shape))


def columns(rows: Sequence[Sequence[str]], left: Sequence[int] = (0,)) -> str:
    """``rows`` as columns two spaces apart, those in ``left`` left-aligned, the others
    right-aligned (the tables printed last on the terminal)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(widths[i]) if i in left else c.rjust(widths[i]) for i, c in enumerate(r))
                     for r in rows)


def gpu_list(machine: dict) -> str:
    """The machine's GPUs with their memory, or ``none``."""
    return ", ".join(f"{g['name']} ({format_bytes(g['memory_total'])})" for g in machine["gpus"]) or "none"


def stack_line(machine: dict) -> str:
    """The markdown line of the installed stack's versions."""
    return "- stack: " + ", ".join(f"{k} {v}" for k, v in machine["stack"].items() if v)


def stream_log(stream):
    """A ``log(message)`` that prints each progress line to ``stream`` at once (None: silent)."""
    def log(message: str) -> None:
        if stream is not None:
            print(message, file=stream, flush=True)

    return log
