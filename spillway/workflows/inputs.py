"""Where a workflow's input array comes from.

Three sources, one interface (:class:`Source`):

* ``random``: the seeded generator of :mod:`.random`, whose values depend only on the seed
  and each element's position, never on chunks or workers;
* a Zarr v3 array store named by path (the ``input`` parameter), read chunk by chunk by
  the workers: on GPU workers straight into device memory (KvikIO; see :mod:`.zarr`);
* an array handed over from Python: a dask array, a CuPy or NumPy array, or anything that
  exposes ``__cuda_array_interface__`` (Numba, PyTorch on CUDA) or DLPack. Device arrays
  are wrapped by CuPy, host arrays by NumPy, without a copy where the protocols allow.

A source also reads any region of itself back as NumPy float64 on the client, which is
what the reference checks compare against.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spillway.options.errors import ParamError

from . import random
from .backend import chunk_backend_for, device_meta, to_device, to_numpy
from .chunking import shape_from_size
from .params import DTYPES, Param, Params, Target
from .placement import assign, planned_bytes, spread_workers

RANDOM = "random"
#: threads that read input panels for references
READ_THREADS = 8


def input_param(name: str = "input", what: str = "the input") -> Param:
    return Param(name, "str", f"Where {what} comes from: random (seeded) or the path of a Zarr v3 array",
                 default=RANDOM)


CHUNKS_HELP = "Chunk shape (10000x10000), bytes per chunk (800MB) or auto"
PANELS_HELP = ("Row panel height: a chunk shape whose first entry is the rows per panel (100000x64), "
               "bytes per panel (800MB) or auto")


def size_params(default, gpu_default, *, what="Array shape", chunks_help=CHUNKS_HELP) -> tuple[Param, ...]:
    """The parameters every generated input shares: size, chunks, dtype, seed."""
    return (
        Param("size", "size", f"{what} as a shape (40000x40000) or total bytes (200GB)",
              default=default, gpu_default=gpu_default),
        Param("chunks", "chunks", chunks_help, default="auto"),
        Param("dtype", "dtype", "Element type of generated inputs", default="float64"),
        Param("seed", "int", "Seed of the random input", default=0, minimum=0, maximum=2**63 - 1),
    )


def tall_shape(nbytes: int, columns: int, dtype: str, *, name: str = "size") -> tuple[int, int]:
    """A ``columns``-wide shape of about ``nbytes``."""
    rows = nbytes // (columns * np.dtype(dtype).itemsize)
    if rows < 1:
        raise ParamError(f"{name}: {nbytes} bytes is less than one row of {columns} {dtype} columns")
    return (int(rows), columns)


@dataclass(frozen=True)
class Source:
    """A lazy input array and how to read it back for reference checks."""

    #: dask array with chunks of the worker backend (CuPy on GPU workers)
    array: Any
    #: "random", "zarr" or "array"
    kind: str
    #: region (tuple of slices) -> NumPy float64 copy, read on the client
    region: Callable[[tuple[slice, ...]], np.ndarray]
    #: bytes read from storage
    bytes_read: int = 0
    #: worker -> bytes of the input assigned to it, where its chunks carry placement
    placement: Mapping[str, int] = field(default_factory=dict)

    @property
    def placed(self) -> bool:
        return bool(self.placement)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.array.shape)

    @property
    def dtype(self) -> str:
        return str(self.array.dtype)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=object)) * np.dtype(self.dtype).itemsize

    def whole(self) -> np.ndarray:
        return self.region(tuple(slice(0, n) for n in self.shape))

    def panels(self, budget: int = 128 * 2**20, then=None):
        """(start, stop, float64 block) row panels of about ``budget`` bytes, in order:
        references of inputs too large for the client read them a few panels at a time.

        Panels are read by a few threads ahead of the consumer (NumPy releases the GIL in
        the generator's arithmetic), so a reference of gigabytes takes seconds, not minutes.
        ``then(block)``, where given, runs in those threads too and its result is yielded in
        the block's place: a reference whose per-panel work is heavier than the read (the
        elementwise chain's exp and sin) would otherwise run it on one core, minutes for
        the 100 GB inputs of the out-of-core runs.
        """
        row_bytes = 8 * int(np.prod(self.shape[1:], dtype=object))
        rows = max(1, budget // max(1, row_bytes))
        rest = tuple(slice(0, n) for n in self.shape[1:])
        bounds = iter([(start, min(self.shape[0], start + rows)) for start in range(0, self.shape[0], rows)])
        ahead = max(1, min(READ_THREADS, os.cpu_count() or 1))

        def read(bound):
            block = self.region((slice(*bound), *rest))
            return block if then is None else then(block)

        with ThreadPoolExecutor(ahead) as pool:
            pending = deque((b, pool.submit(read, b)) for b in itertools.islice(bounds, ahead))
            while pending:
                (start, stop), future = pending.popleft()
                following = next(bounds, None)
                if following is not None:
                    pending.append((following, pool.submit(read, following)))
                yield start, stop, future.result()


def describe(params: Params, *, name: str = "x", input_name: str = "input", ndim: int = 2,
             size_name: str = "size", shape: tuple[int, ...] | None = None,
             columns: int | None = None) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of an input without reading any data: validation uses it.

    A generated input takes ``shape`` where given, else the ``size`` parameter; a size in
    bytes gives a square (cube) shape, or ``columns`` wide where given (tall-skinny).
    """
    if name in params.arrays:
        array = params.arrays[name]
        shape, dtype = _shape_dtype_of(array, name)
    elif params.get(input_name, RANDOM) != RANDOM:
        meta = _zarr_meta(params[input_name], input_name)
        shape, dtype = meta.shape, str(meta.dtype)
    elif shape is not None:
        return tuple(shape), params.dtype
    elif columns is not None and not isinstance(params[size_name], tuple):
        return tall_shape(params[size_name], columns, params.dtype, name=size_name), params.dtype
    else:
        return shape_from_size(params[size_name], ndim, params.dtype, name=size_name), params.dtype
    if len(shape) != ndim:
        raise ParamError(f"{name}: array of shape {'x'.join(map(str, shape))} has {len(shape)} dimensions, "
                         f"expected {ndim}")
    if dtype not in DTYPES:
        raise ParamError(f"{name}: dtype {dtype} is not supported ({', '.join(DTYPES)})")
    if any(n < 1 for n in shape):
        raise ParamError(f"{name}: shape {'x'.join(map(str, shape))} has an empty dimension")
    return tuple(int(n) for n in shape), dtype


def source_kind(params: Params, *, name: str = "x", input_name: str = "input") -> str:
    """The :attr:`Source.kind` :func:`open_source` makes of ``name``, from the parameters
    alone: the caller's array, a Zarr store, or generated from the seed."""
    if name in params.arrays:
        return "array"
    return RANDOM if params.get(input_name, RANDOM) == RANDOM else "zarr"


def open_source(params: Params, target: Target, chunks, *, name: str = "x", stream: int = 0,
                input_name: str = "input", ndim: int = 2, size_name: str = "size",
                shape: tuple[int, ...] | None = None, columns: int | None = None) -> Source:
    """The input ``name`` as a lazy dask array with ``chunks``; reads nothing.

    ``chunks`` is a chunk shape, or a function of (shape, dtype) that returns one.
    """
    shape, dtype = describe(params, name=name, input_name=input_name, ndim=ndim, size_name=size_name, shape=shape,
                            columns=columns)
    if callable(chunks):
        chunks = chunks(shape, dtype)
    backend = target.chunk_backend or chunk_backend_for(target.kind)
    kind = source_kind(params, name=name, input_name=input_name)
    if kind == "array":
        return _from_python(params.arrays[name], chunks, backend)
    if kind == "zarr":
        return _from_zarr(params[input_name], chunks, backend, input_name)
    nbytes = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
    workers = spread_workers(target, nbytes)
    array = random.uniform(shape, chunks, seed=params.seed, stream=stream, dtype=dtype, backend=backend,
                           workers=workers)
    seed = params.seed

    def region(slices):
        location = tuple((s.start, s.stop) for s in slices)
        return random.uniform_block(seed, stream, shape, location, dtype, "numpy").astype(np.float64)

    placed = planned_bytes(assign(array.chunks, np.dtype(dtype).itemsize, workers), array.chunks,
                           np.dtype(dtype).itemsize) if workers else {}
    return Source(array=array, kind=RANDOM, region=region, placement=placed)


# --- Zarr v3 stores


def _zarr_meta(path: str, input_name: str):
    """The zarr array at ``path``, read through the store as pinned (:mod:`.zarr.pinned`)."""
    from .zarr.pinned import open_pinned, pin_of

    pin = pin_of(path, input_name)
    try:
        array = open_pinned(pin)
    except ParamError:
        raise
    except Exception as e:  # zarr raises several types for "not an array here"
        raise ParamError(f"{input_name}: {path!r} is not a Zarr array ({type(e).__name__})") from None
    if array.metadata.zarr_format != 3:
        raise ParamError(f"{input_name}: {path!r} is Zarr v{array.metadata.zarr_format}, expected v3")
    return array


def _from_zarr(path: str, chunks, backend: str, input_name: str) -> Source:
    from .zarr.pinned import open_pinned, pin_store
    from .zarr.read import open_array

    # pinned once, here or when the service checked it: the graph, the reference and the
    # metadata all read the directory named now, whatever is put at its name later
    path = pin_store(path, input_name)
    meta = _zarr_meta(path, input_name)
    # on GPU workers each stored chunk is read into device memory (zarr.read), then rechunked there
    stored = open_array(path, backend)
    array = stored.rechunk(chunks) if stored.chunksize != tuple(chunks) else stored
    pin = path.pin

    def region(slices):
        return np.asarray(open_pinned(pin)[slices], dtype=np.float64)

    nbytes = int(np.prod(meta.shape, dtype=object)) * meta.dtype.itemsize
    return Source(array=array, kind="zarr", region=region, bytes_read=nbytes)


# --- arrays from Python


def _shape_dtype_of(array, name) -> tuple[tuple[int, ...], str]:
    shape = getattr(array, "shape", None)
    dtype = getattr(array, "dtype", None)
    if shape is None or dtype is None:
        raise ParamError(f"{name}: {type(array).__name__} is not an array (no shape and dtype)")
    text = str(dtype).removeprefix("torch.")
    return tuple(int(n) for n in shape), text


#: DLPack device types whose memory CuPy wraps: CUDA device and CUDA managed memory
_DLPACK_CUDA = (2, 13)


def wrap(array, backend: str):
    """A CuPy or NumPy view of ``array`` (or the dask array itself), copying only across
    devices: device memory stays on the device through DLPack or
    ``__cuda_array_interface__``; host memory through DLPack or the buffer protocol.

    DLPack is asked first: PyTorch CPU tensors raise (not AttributeError) when asked for
    ``__cuda_array_interface__``.
    """
    if hasattr(array, "dask") and hasattr(array, "chunks"):
        return array
    if hasattr(array, "__dlpack_device__") and hasattr(array, "__dlpack__"):
        device_type, _ = array.__dlpack_device__()
        if device_type in _DLPACK_CUDA:
            import cupy

            device = cupy.from_dlpack(array)
            return device if backend == "cupy" else device.get()
        return np.from_dlpack(array)
    if hasattr(array, "__cuda_array_interface__"):
        import cupy

        device = cupy.asarray(array)  # wraps the same device pointer
        return device if backend == "cupy" else device.get()
    return np.asarray(array)


def _from_python(array, chunks, backend: str) -> Source:
    import dask.array as da
    from dask.array.utils import meta_from_array

    wrapped = wrap(array, backend)
    if isinstance(wrapped, da.Array):
        darr = wrapped.rechunk(chunks) if wrapped.chunksize != tuple(chunks) else wrapped
        on_device = type(meta_from_array(darr)).__module__.startswith("cupy")
        if backend == "cupy" and not on_device:
            darr = darr.map_blocks(to_device, meta=device_meta(darr.dtype, darr.ndim))
        elif backend == "numpy" and on_device:
            darr = darr.map_blocks(to_numpy, meta=np.empty((0,) * darr.ndim, dtype=darr.dtype))

        def region(slices):
            return np.asarray(to_numpy(darr[slices].compute()), dtype=np.float64)
    else:
        darr = da.from_array(wrapped, chunks=chunks, asarray=False)
        if backend == "cupy" and isinstance(wrapped, np.ndarray):
            darr = darr.map_blocks(to_device, meta=device_meta(darr.dtype, darr.ndim))

        def region(slices):
            return np.asarray(to_numpy(wrapped[slices]), dtype=np.float64)

    return Source(array=darr, kind="array", region=region)
