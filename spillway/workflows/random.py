"""Seeded random arrays whose values depend only on the seed and the element's position.

Each element is a counter-based hash (SplitMix64) of its global linear index, so the same
seed gives the same array whatever the chunking, the number of workers or the array
module (NumPy or CuPy): a test can regenerate any chunk, or the whole array, on the CPU.
"""

from __future__ import annotations

import math

import numpy as np

from .backend import array_module

_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _key(seed: int, stream: int) -> int:
    """A 64-bit key per (seed, stream): distinct inputs of one workflow use distinct streams."""
    z = (seed * _GOLDEN + stream * _M1 + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return (z * _M2) & 0xFFFFFFFFFFFFFFFF


def linear_index(xp, shape: tuple[int, ...], location: tuple[tuple[int, int], ...]):
    """uint64 global linear indices of the block at ``location`` in an array of ``shape``."""
    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    idx = None
    for d, ((start, stop), stride) in enumerate(zip(location, strides)):
        axis = xp.arange(start, stop, dtype=xp.uint64) * xp.uint64(stride)
        view = axis.reshape([-1 if i == d else 1 for i in range(len(shape))])
        idx = view if idx is None else idx + view
    return xp.broadcast_to(idx, tuple(b - a for a, b in location))


def _splitmix(xp, z):
    z = z + xp.uint64(_GOLDEN)
    z = (z ^ (z >> xp.uint64(30))) * xp.uint64(_M1)
    z = (z ^ (z >> xp.uint64(27))) * xp.uint64(_M2)
    return z ^ (z >> xp.uint64(31))


def uniform_block(
    seed: int,
    stream: int,
    shape: tuple[int, ...],
    location: tuple[tuple[int, int], ...],
    dtype: str,
    backend: str,
    low: float = 0.0,
    high: float = 1.0,
):
    """The block at ``location`` of a uniform [low, high) array of ``shape``."""
    xp = array_module(backend)
    with np.errstate(over="ignore"):
        z = _splitmix(xp, linear_index(xp, shape, location) ^ xp.uint64(_key(seed, stream)))
        if np.dtype(dtype) == np.float32:
            u = (z >> xp.uint64(40)).astype(xp.float32) * xp.float32(2.0**-24)
        else:
            u = (z >> xp.uint64(11)).astype(xp.float64) * 2.0**-53
    if low != 0.0 or high != 1.0:
        u = u * (high - low) + low
    return u.astype(dtype, copy=False)


def uniform(
    shape: tuple[int, ...],
    chunks,
    *,
    seed: int,
    stream: int = 0,
    dtype: str = "float64",
    backend: str = "numpy",
    low: float = 0.0,
    high: float = 1.0,
    workers: tuple[str, ...] = (),
):
    """A lazy dask array of seeded uniform values; nothing is computed until asked.

    With ``workers``, its chunks are spread evenly over them (see :mod:`.placement`).
    """
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    shape = tuple(int(s) for s in shape)
    chunks = da.core.normalize_chunks(chunks, shape, dtype=np.dtype(dtype))
    name = "uniform-" + tokenize(seed, stream, shape, chunks, dtype, backend, low, high, workers)
    offsets = [np.cumsum((0,) + c) for c in chunks]
    layer = {}
    for index in np.ndindex(*[len(c) for c in chunks]):
        location = tuple((int(offsets[d][i]), int(offsets[d][i + 1])) for d, i in enumerate(index))
        layer[(name, *index)] = (uniform_block, seed, stream, shape, location, dtype, backend, low, high)
    annotations = None
    if workers:
        from .placement import assign

        by_block = assign(chunks, np.dtype(dtype).itemsize, workers)
        by_key = {(name, *index): [worker] for index, worker in by_block.items()}
        annotations = {"workers": by_key.__getitem__, "allow_other_workers": True}
    graph = HighLevelGraph({name: MaterializedLayer(layer, annotations=annotations)}, {name: set()})
    # the chunks' own type: dask builds what it adds from the meta (map_overlap's constant
    # boundary, full_like, concatenations), and numpy there beside CuPy chunks fails
    meta = np.empty((0,) * len(shape), dtype=dtype)
    if backend == "cupy":
        from .backend import device_meta

        try:
            meta = device_meta(dtype, len(shape))
        except ImportError:
            pass  # a GPU graph planned where CuPy is not installed (sizes, footprints): never computed here
    return da.Array(graph, name, chunks, meta=meta)
