"""Shapes from sizes, and automatic chunks that suit the worker kind.

GPU chunks are hundreds of MB, large enough to keep the GPU and the NVLink busy per task;
CPU chunks are tens of MB so the small defaults still make many tasks.
"""

from __future__ import annotations

import math

import numpy as np

from spillway.options.errors import ParamError
from spillway.options.sizes import format_bytes

from .params import Target

#: bytes per chunk that automatic chunking aims for, by worker kind
CHUNK_BYTES = {"gpu": 800_000_000, "cpu": 32 * 2**20}


def shape_from_size(size, ndim: int, dtype: str, *, name: str = "size") -> tuple[int, ...]:
    """``size`` is a shape tuple or total bytes; bytes give an equal-sided shape."""
    if isinstance(size, tuple):
        if len(size) == 1 and ndim > 1:
            return size * ndim
        if len(size) != ndim:
            raise ParamError(f"{name}: {'x'.join(map(str, size))} has {len(size)} dimensions, expected {ndim}")
        return size
    itemsize = np.dtype(dtype).itemsize
    side = int(math.floor((size / itemsize) ** (1.0 / ndim) * (1 + 1e-12)))
    if side < 1:
        raise ParamError(f"{name}: {format_bytes(size)} is smaller than one {dtype} element")
    return (side,) * ndim


def even_split(n: int, target: int) -> int:
    """The chunk length closest to ``target`` that splits ``n`` into near-equal parts."""
    target = max(1, min(n, target))
    parts = math.ceil(n / target)
    return math.ceil(n / parts)


def auto_chunks(shape: tuple[int, ...], dtype: str, target: Target) -> tuple[int, ...]:
    """Equal-sided chunks of about ``CHUNK_BYTES[target.kind]``."""
    itemsize = np.dtype(dtype).itemsize
    budget = CHUNK_BYTES[target.kind] / itemsize
    side = max(1, int(budget ** (1.0 / len(shape))))
    return tuple(even_split(n, side) for n in shape)


#: most chunks one array may have: the graph is built on the client before admission, so
#: a huge size with small chunks is refused here rather than by running out of memory.
#: Where the cluster is known, a size it cannot hold is refused in bytes before this check
#: (Workflow.validate's ``fits``): the chunks of such a size are not the user's problem.
MAX_CHUNKS = 2_000_000


def check_count(chunks: tuple[int, ...], shape: tuple[int, ...], *, name="chunks",
                dtype: str | None = None) -> tuple[int, ...]:
    count = math.prod(math.ceil(n / c) for n, c in zip(shape, chunks))
    if count > MAX_CHUNKS:
        # the array's bytes too: where no cluster is known yet (a Slurm job being written),
        # this is the refusal a huge size gets, and the size is what to change
        nbytes = f" ({format_bytes(math.prod(shape) * np.dtype(dtype).itemsize)})" if dtype else ""
        raise ParamError(f"{name}: {'x'.join(map(str, chunks))} makes {count} chunks of the "
                         f"{'x'.join(map(str, shape))} array{nbytes}, more than the limit of {MAX_CHUNKS}; "
                         "use larger chunks")
    return chunks


def resolve_chunks(chunks, shape: tuple[int, ...], dtype: str, target: Target, *, name="chunks"):
    """Chunks from a parameter value: "auto", bytes per chunk, or a chunk shape."""
    return check_count(_resolve_chunks(chunks, shape, dtype, target, name=name), shape, name=name, dtype=dtype)


def _resolve_chunks(chunks, shape: tuple[int, ...], dtype: str, target: Target, *, name="chunks"):
    if chunks == "auto":
        return auto_chunks(shape, dtype, target)
    if isinstance(chunks, int):  # bytes per chunk
        itemsize = np.dtype(dtype).itemsize
        side = max(1, int((chunks / itemsize) ** (1.0 / len(shape))))
        return tuple(even_split(n, side) for n in shape)
    if len(chunks) == 1 and len(shape) > 1:
        chunks = chunks * len(shape)
    if len(chunks) != len(shape):
        raise ParamError(
            f"{name}: {'x'.join(map(str, chunks))} has {len(chunks)} dimensions but the array has {len(shape)}"
        )
    for c, n in zip(chunks, shape):
        if c > n:
            raise ParamError(
                f"{name}: chunk {'x'.join(map(str, chunks))} is larger than the array {'x'.join(map(str, shape))}"
            )
    return tuple(chunks)


def panel_rows(chunks, shape: tuple[int, ...], dtype: str, target: Target, *, name="chunks") -> int:
    """Rows per row panel (chunks spanning every other axis), from a chunks parameter: auto,
    bytes per panel, or a chunk shape whose first entry is the panel height."""
    itemsize = np.dtype(dtype).itemsize
    row_bytes = math.prod(shape[1:]) * itemsize
    if chunks == "auto":
        rows = max(1, CHUNK_BYTES[target.kind] // row_bytes)
    elif isinstance(chunks, int):
        rows = max(1, chunks // row_bytes)
    else:
        rows = chunks[0]
        if rows > shape[0]:
            raise ParamError(f"{name}: panel of {rows} rows is larger than the array's {shape[0]} rows")
    rows = even_split(shape[0], rows)
    check_count((rows, *shape[1:]), shape, name=name, dtype=dtype)
    return rows
