"""Reading a stored array: a lazy dask array of one task per stored chunk, and the task,
which reads its chunk on the worker: on the direct path into device memory (or, for a
few large zstd frames, into host memory in the pool of :mod:`.host_decode`, many chunks
at once), else through zarr on the host, then copied to the device once (the package
docstring says which chunks go which way)."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np

from ..backend import module_of
from . import device_io, fallback, host_decode
from .chunk_files import CODECS, RAW, SHARDED, ZSTD, ChunkFiles, chunk_files_of
from .pinned import Pin, fd_path, open_key, open_pinned, pin_store
from .shards import read_shard


def open_array(path: str, backend: str):
    """A lazy dask array over the Zarr v3 array at ``path``, pinned (:mod:`.pinned`): the
    array read is the directory ``path`` named now (or when it was checked, for a
    :class:`~.pinned.PinnedPath`), whatever is put at that name later. NumPy chunks
    through ``da.from_zarr`` for ``backend="numpy"``; for ``"cupy"``, one block per stored
    chunk, each read on the worker into device memory (see the package docstring)."""
    import dask.array as da
    from dask.base import tokenize

    if backend not in ("numpy", "cupy"):
        raise ValueError(f"backend: {backend!r} is not one of numpy, cupy")
    pin = pin_store(path).pin
    stored = open_pinned(pin)
    if backend == "numpy":
        # a block per shard: dask's default (a block per inner chunk) rereads a shard's
        # index for each of its inner chunks and makes hundreds of tasks per shard
        chunks = getattr(stored, "shards", None) or stored.chunks
        # the keys name the directory read, so two jobs share them only for the same one
        return da.from_zarr(stored, chunks=chunks, name="from-zarr-" + tokenize(pin, _version_stamp(pin), chunks))
    from ..backend import device_meta

    files = replace(chunk_files_of(stored), pin=pin)
    if files.root is None:
        files = replace(files, root=pin.root, encoding=CODECS)
    return chunk_reads(files, device_meta(np.dtype(files.dtype), len(files.shape)),
                       "zarr-read-" + tokenize(files, _version_stamp(pin)))


def chunk_reads(files: ChunkFiles, meta, name: str):
    """One :func:`read_chunk` task per stored chunk, as a dask array with ``meta``."""
    import dask.array as da

    return da.map_blocks(read_chunk, dtype=np.dtype(files.dtype), chunks=files.dask_chunks(), meta=meta,
                         name=name, files=files)


def _version_stamp(pin: Pin) -> tuple:
    """Changes when the store is rewritten, so dask does not reuse an older read's keys."""
    fd = open_key(pin, "zarr.json")
    if fd is None:
        return ()
    try:
        st = os.fstat(fd)
        return (st.st_mtime_ns, st.st_size)
    finally:
        os.close(fd)


def read_chunk(files: ChunkFiles, block_info=None):
    """The stored chunk of this dask block, as a CuPy array on this worker's GPU."""
    info = block_info[None]
    coords = tuple(info["chunk-location"])
    shape = tuple(info["chunk-shape"])
    direct = files.encoding in (RAW, ZSTD, SHARDED)
    if direct and files.zstd and not files.gpu_decodes():
        # a few large zstd frames: a host core decodes them faster than nvCOMP, and several
        # chunks at once in the pool of host_decode, each copied to the device there
        try:
            return host_decode.read_in_pool(lambda io: read_direct(files, coords, shape, io),
                                            need=host_decode.bytes_to_read(files, coords, to_device=True))
        except fallback.Fallback as why:
            fallback.note("direct read", f"chunk {coords} of {files.root}: {why}; read through zarr on the host")
    elif direct and device_io.kvikio_available():
        try:
            return read_direct(files, coords, shape, device_io.gpu_io())
        except fallback.Fallback as why:
            fallback.note("direct read", f"chunk {coords} of {files.root}: {why}; read through zarr on the host")
    elif direct:
        fallback.note("no kvikio", "kvikio is not installed on this worker: Zarr chunks are read on the host "
                      "and copied (install spillway[cuda13] or [cuda12])")
    return _to_device(_read_with_zarr(files, info["array-location"]))


def read_direct(files: ChunkFiles, coords, shape, io):
    """Read the chunk at ``coords`` without zarr: the whole file into a buffer of ``io``
    (device memory with KvikIO; host memory in the CPU tests of this logic), viewed as
    the chunk (decoded first if zstd; assembled from its inner chunks if a shard) and cut
    to ``shape`` at the array's edge. A missing file is the fill value, as in zarr. The file
    is opened once (through the pinned store: :meth:`ChunkFiles.open_chunk`) and read
    through that descriptor's name, never the chunk's."""
    dtype = np.dtype(files.dtype)
    fd = files.open_chunk(coords)
    if fd is None:
        return io.xp.full(shape, files.fill_value, dtype=dtype)
    try:
        return _read_open(files, fd_path(fd), os.fstat(fd).st_size, shape, dtype, io)
    finally:
        os.close(fd)


def _read_open(files: ChunkFiles, path: str, size: int, shape, dtype, io):
    if files.encoding == SHARDED:
        chunk = read_shard(files, path, size, io)
    elif files.encoding == RAW:
        if size != files.chunk_bytes:
            raise fallback.Fallback(f"file of {size} bytes, expected {files.chunk_bytes}")
        chunk = io.read(path, size).view(dtype).reshape(files.chunk_shape)
    elif hasattr(io, "decode_zstd_file"):  # the host: possibly streamed to the device
        chunk = io.decode_zstd_file(path, size, files.chunk_bytes).view(dtype).reshape(files.chunk_shape)
    else:
        out = io.empty(files.chunk_bytes)
        io.decode_zstd([io.read(path, size)], [out])
        chunk = out.view(dtype).reshape(files.chunk_shape)
    if shape != files.chunk_shape:  # cut where the chunk is (a streamed chunk is on the device)
        chunk = module_of(chunk).ascontiguousarray(chunk[tuple(slice(0, n) for n in shape)])
    return chunk


def _read_with_zarr(files: ChunkFiles, location):
    import zarr

    region = tuple(slice(int(a), int(b)) for a, b in location)
    array = open_pinned(files.pin) if files.pin is not None else zarr.open_array(files.root, mode="r")
    return array[region]


def _to_device(block):
    import cupy

    return cupy.asarray(block)
