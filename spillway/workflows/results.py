"""How array results are summarised and checked.

An array result is computed in full (the Zarr writer may store it), but what comes back
to the client is small: a float64 checksum of every element and a *probe*, a region of
the result that the NumPy float64 reference recomputes from the input. Up to
``FULL_CHECK_BYTES`` the probe is the whole result; beyond, it is a window that straddles
chunk boundaries, where chunking mistakes show.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .backend import to_numpy
from .workflow import TOLERANCE, BuiltRun, Footprint

#: results up to this size are compared whole with the reference
FULL_CHECK_BYTES = 64 * 2**20
#: inputs up to this size are regenerated whole on the client for the reference
REFERENCE_WHOLE_BYTES = 512 * 2**20


def tolerance(dtype) -> float:
    """The relative-error tolerance of a result computed in ``dtype`` (real or complex)."""
    real = np.finfo(np.dtype(dtype)).dtype.name
    return TOLERANCE[real]


def window(n: int, boundary: int, width: int) -> slice:
    """At most ``width`` indices of ``range(n)`` centred on ``boundary``."""
    width = min(n, width)
    start = min(max(0, boundary - width // 2), n - width)
    return slice(start, start + width)


def first_boundary(chunks_along_axis) -> int:
    return int(chunks_along_axis[0]) if len(chunks_along_axis) > 1 else int(chunks_along_axis[0]) // 2


def nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize


def array_run(
    result,
    *,
    probe,
    reference: Callable[[], tuple[np.ndarray, str]],
    footprint: Footprint,
    source=None,
    extra: Callable[[tuple], dict] | None = None,
    more: tuple = (),
) -> BuiltRun:
    """A built run whose result is the array ``result``; ``probe`` is the lazy region of it
    that ``reference()`` recomputes in NumPy float64. ``more`` are further lazy values
    computed in the same graph, handed to ``extra`` for the summary."""
    complex_result = np.issubdtype(result.dtype, np.complexfloating)
    checksum = result.sum(dtype=np.complex128 if complex_result else np.float64)

    def summarize(value) -> dict:
        total = to_numpy(value[0]).item()
        out = {
            "shape": list(result.shape),
            "chunks": [int(c[0]) for c in result.chunks],
            "dtype": str(result.dtype),
            "checksum": [total.real, total.imag] if complex_result else float(total),
        }
        if extra is not None:
            out.update(extra(tuple(value[2:])))
        out.update(placement_summary(source))
        return out

    return BuiltRun(
        result=(checksum, probe, *more),
        footprint=footprint,
        summarize=summarize,
        reference=lambda _computed: reference(),
        tolerance=tolerance(result.dtype),
        array=result,
        checked=lambda value: value[1],
        bytes_read=source.bytes_read if source is not None else 0,
        optimize_graph=not (source is not None and source.placed),
    )


def placement_summary(source) -> dict:
    """The input's bytes per worker as placed, for the report (empty when not placed)."""
    if source is None or not source.placed:
        return {}
    return {"input_bytes_per_worker": dict(source.placement)}


def scalar_run(result, *, reference, footprint: Footprint, dtype, source=None, name="value", extra=None) -> BuiltRun:
    """A built run whose result is a small array or scalar compared whole with the reference;
    ``dtype`` is the precision it was computed in (sets the tolerance)."""

    def summarize(value) -> dict:
        array = to_numpy(value)
        out = {name: float(array) if array.ndim == 0 else array.tolist()} if array.size <= 16 else {
            name + "_sum": float(array.sum()), "shape": list(array.shape)}
        out["dtype"] = str(array.dtype)
        out["checksum"] = float(np.asarray(array, dtype=np.float64).sum())
        if extra:
            out.update(extra)
        out.update(placement_summary(source))
        return out

    return BuiltRun(
        result=result,
        footprint=footprint,
        summarize=summarize,
        reference=lambda _computed: reference(),
        tolerance=tolerance(dtype),
        bytes_read=source.bytes_read if source is not None else 0,
        optimize_graph=not (source is not None and source.placed),
    )


def footprint(input_bytes: int, output_bytes: int, chunk_bytes: int, n_workers: int, *,
              temporaries: int = 3) -> Footprint:
    """Peak bytes: inputs and outputs held at once, plus ``temporaries`` chunks per worker
    (a task's input, output and scratch) on every worker."""
    n = max(1, n_workers)
    held = input_bytes + output_bytes
    return Footprint(
        total_bytes=held + temporaries * chunk_bytes * n,
        per_worker_bytes=-(-held // n) + temporaries * chunk_bytes,
        input_bytes=input_bytes,
    )
