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


def _splitmix_into(xp, z, t) -> None:
    """SplitMix64's finaliser of the uint64 array ``z`` (NumPy or CuPy), in place; ``t`` is
    scratch of its shape. In place because the expression form made a temporary of the
    block's size per operation, a dozen passes over memory."""
    z += xp.uint64(_GOLDEN)
    for shift, mult in ((30, _M1), (27, _M2)):
        xp.right_shift(z, xp.uint64(shift), out=t)
        z ^= t
        z *= xp.uint64(mult)
    xp.right_shift(z, xp.uint64(31), out=t)
    z ^= t


def _unit_into(xp, z, out) -> None:
    """Uniform [0, 1) values of the hashed ``z`` into ``out`` (float32: its top 24 bits,
    float64: its top 53, both exact); ``z`` is overwritten."""
    bits = 24 if out.dtype == np.float32 else 53
    xp.right_shift(z, xp.uint64(64 - bits), out=z)
    out[...] = z
    out *= 2.0**-bits


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
    if xp is np:
        u = _uniform_host(seed, stream, shape, location, dtype)
    else:
        # the whole block at once: the GPU hashes it in a few kernels
        z = linear_index(xp, shape, location) ^ xp.uint64(_key(seed, stream))
        _splitmix_into(xp, z, xp.empty_like(z))
        u = xp.empty(z.shape, xp.float32 if np.dtype(dtype) == np.float32 else xp.float64)
        _unit_into(xp, z, u)
    if low != 0.0 or high != 1.0:
        u = u * (high - low) + low
    return u.astype(dtype, copy=False)


#: elements of one piece of the host generator: its two uint64 buffers (1 MiB) stay in a
#: core's cache across the hash's dozen passes
_PIECE = 1 << 16


def _uniform_host(seed: int, stream: int, shape: tuple[int, ...], location: tuple[tuple[int, int], ...],
                  dtype: str) -> np.ndarray:
    """:func:`uniform_block` on the host, the same bits as the whole block hashed at once.

    The whole-block expression makes a block-sized temporary per operation, a dozen passes
    over memory: 0.12-0.26 GB/s a core (the CI machine, the H200 host). Here the hash runs
    in place on cache-sized pieces: 0.94-1.5 GB/s a core on the same two, which is what
    keeps the NumPy float64 references of the out-of-core runs, hundreds of GB regenerated
    on the host, from taking longer than the runs.
    """
    single = np.dtype(dtype) == np.float32
    extent = tuple(b - a for a, b in location)
    out = np.empty(extent, dtype=np.float32 if single else np.float64)
    flat = out.reshape(-1)
    # rows that span every trailing element have consecutive linear indices: no index array
    whole_rows = all(a == 0 and b == n for (a, b), n in zip(location[1:], shape[1:]))
    first = location[0][0] * math.prod(shape[1:]) if whole_rows else 0
    index = None if whole_rows else np.ascontiguousarray(linear_index(np, shape, location)).reshape(-1)
    key = np.uint64(_key(seed, stream))
    z_buf = np.empty(min(_PIECE, flat.size), np.uint64)
    t_buf = np.empty_like(z_buf)
    with np.errstate(over="ignore"):
        for lo in range(0, flat.size, _PIECE):
            hi = min(flat.size, lo + _PIECE)
            z, t = z_buf[: hi - lo], t_buf[: hi - lo]
            if index is None:
                z[:] = np.arange(first + lo, first + hi, dtype=np.uint64)
            else:
                z[:] = index[lo:hi]
            z ^= key
            _splitmix_into(np, z, t)
            _unit_into(np, z, flat[lo:hi])
    return out


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
