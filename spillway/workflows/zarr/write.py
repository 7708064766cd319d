"""Writing an array: a lazy dask collection that creates the Zarr v3 array (metadata
only, on the client) and writes each block to its chunk file on the worker that holds
it, a device block straight from device memory with KvikIO, a host block through zarr
(the package docstring says why chunks are written uncompressed)."""

from __future__ import annotations

import errno
import math
import os

import numpy as np

from . import device_io, fallback
from .chunk_files import RAW, ChunkFiles, chunk_files_of


def creation_kwargs(shape, chunks, dtype) -> dict:
    """What :func:`zarr.create_array` is given for an output, by both paths."""
    return {"shape": tuple(int(n) for n in shape), "chunks": tuple(int(c) for c in chunks),
            "dtype": np.dtype(dtype), "zarr_format": 3, "compressors": None}


def store(array, path: str):
    """A lazy dask collection that writes ``array`` to a new Zarr v3 store at ``path``
    (replacing one there), chunk by chunk on the workers; its chunks become the store's
    (irregular chunks are first made regular, as zarr needs). The store is created here
    (metadata only); each task writes its block: a device block straight from the device,
    a host block through zarr (see the package docstring)."""
    import zarr

    if not _regular(array.chunks):
        array = array.rechunk(tuple(max(c) for c in array.chunks))
    chunks = tuple(max(c[0], 1) for c in array.chunks)
    created = zarr.create_array(store=path, overwrite=True, **creation_kwargs(array.shape, chunks, array.dtype))
    files = chunk_files_of(created)
    ones = tuple((1,) * len(c) for c in array.chunks)
    written = array.map_blocks(write_chunk, files=files, dtype=np.int64, chunks=ones,
                               meta=np.empty((0,) * array.ndim, dtype=np.int64))
    return written.sum()


def _regular(chunks) -> bool:
    return all(len(set(c[:-1])) <= 1 and (len(c) == 1 or c[-1] <= c[0]) for c in chunks)


def _on_device(block) -> bool:
    return hasattr(block, "__cuda_array_interface__")


def write_chunk(block, files: ChunkFiles, block_info=None):
    """Write one block to its chunk file; returns the bytes written (as a block of ones
    in every dimension, summed by :func:`store`). Decided by the block, not the graph's
    meta: a device block goes straight from the device with KvikIO (copied to the host
    and written by zarr without it), a host block is written by zarr. A write the OS
    refuses raises :class:`~spillway.options.errors.StoreWriteError`, and so does a write
    whose store was removed under it (a run stopped by Ctrl-C removes its partial store
    while its workers' last writes are still running)."""
    from spillway.options.errors import StoreWriteError

    try:
        return _write_chunk(block, files, block_info)
    except StoreWriteError:
        raise
    except OSError as e:
        if not e.errno:
            if isinstance(e, FileNotFoundError) and files.root and not os.path.isdir(files.root):
                # zarr's words (no errno) for a store that is gone: "... does not exist",
                # "No array found in store"
                raise StoreWriteError(errno.ENOENT, "the store was removed while it was written",
                                      str(files.root)) from None
            raise
        raise StoreWriteError(e.errno, e.strerror, e.filename) from None


def _write_chunk(block, files: ChunkFiles, block_info):
    info = block_info[0]
    coords = tuple(info["chunk-location"])
    ones = (1,) * block.ndim
    if _on_device(block) and device_io.kvikio_available():
        return np.full(ones, write_direct(files, coords, block, device_io.gpu_io()), dtype=np.int64)
    if _on_device(block):
        fallback.note("no kvikio", "kvikio is not installed on this worker: Zarr chunks are copied to the host and "
                      "written by zarr (install spillway[cuda13] or [cuda12])")
    import zarr

    from spillway.memory.zarr_buffer import to_host

    region = tuple(slice(int(a), int(b)) for a, b in info["array-location"])
    host = to_host(block)
    zarr.open_array(files.root, mode="r+")[region] = host
    return np.full(ones, host.nbytes, dtype=np.int64)


def write_direct(files: ChunkFiles, coords, block, io) -> int:
    """Write ``block`` as the uncompressed chunk at ``coords`` without zarr, as zarr
    would: padded with the fill value at the array's edge, no file where the chunk holds
    only the fill value (unless zarr's ``array.write_empty_chunks`` is set). Returns the
    bytes written."""
    if files.encoding != RAW:
        raise ValueError(f"{files.root}: the direct writer writes uncompressed chunks, not {files.encoding}")
    xp = io.xp
    dtype = np.dtype(files.dtype)
    if tuple(block.shape) != files.chunk_shape:
        padded = xp.full(files.chunk_shape, files.fill_value, dtype=dtype)
        padded[tuple(slice(0, n) for n in block.shape)] = block
        block = padded
    path = files.chunk_path(coords)
    if not _write_empty_chunks() and all_fill(xp, block, files.fill_value):
        try:
            os.remove(path)  # a chunk an earlier write left there
        except FileNotFoundError:
            pass
        return 0
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return io.write(path, xp.ascontiguousarray(block, dtype=dtype))


def all_fill(xp, chunk, fill) -> bool:
    """Whether every element is the fill value, as zarr decides it: a fill of zero
    compares bit patterns for floats (a chunk of -0.0 is written); NaN equals NaN."""
    if chunk.dtype.kind == "f" and fill == 0:
        bits = chunk.view(np.dtype(f"u{chunk.dtype.itemsize}"))
        return not bool(xp.any(bits != 0))
    if chunk.dtype.kind == "f" and isinstance(fill, float) and math.isnan(fill):
        return bool(xp.all(xp.isnan(chunk)))
    return bool(xp.all(chunk == fill))


def _write_empty_chunks() -> bool:
    import zarr

    return bool(zarr.config.get("array.write_empty_chunks", False))
