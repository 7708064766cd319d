"""How Zarr v3 arrays are read into chunks and written from them: the one place that
chooses between the GPU path and the CPU path.

Used by workflow inputs (``--param input=PATH``, :mod:`.inputs`), array outputs
(``--output PATH``, :mod:`.outputs`) and ``cluster.open(...)`` / ``JobResult.array``
(:func:`spillway.service.client.open_output`).

**What spillway writes.** Chunks uncompressed: no compressor and no filter, only Zarr's
``bytes`` codec (little-endian), one file per chunk (default chunk key encoding
``c/i/j``), Zarr v3, zarr's default fill value (0), and, as zarr does by default, no
file for a chunk that holds only the fill value. CPU workers and GPU workers write the
same bytes, so a store does not say which kind of worker wrote it. Uncompressed chunks
are the fastest case for GPUs: a chunk file holds the chunk's bytes as they lie in
device memory, so it moves between the file and the GPU with no decode at all. Numerical
results of simulations (floats) hardly compress with zstd anyway.

**The CPU path** (NumPy chunks) is plain zarr and dask: ``da.from_zarr`` to read,
``da.to_zarr`` to write.

**The GPU path** (CuPy chunks) works per stored chunk, inside the task on the GPU worker
that holds or wants it, so nothing passes through the client:

* *read*, a chunk whose codecs are the ``bytes`` codec alone (what spillway writes): the
  whole chunk file is read with KvikIO straight into a device buffer (GPUDirect Storage
  where the system has it, else KvikIO's POSIX compat mode, reading through pinned
  bounce buffers with its thread pool), and viewed as the chunk: no host copy of the data
  in Python, no decode;
* *read*, a shard (zarr's ``sharding_indexed`` codec, index at either end with zarr's
  default index codecs) of inner chunks that are ``bytes`` or ``bytes`` + ``zstd``: the
  shard file is read with KvikIO into device memory, its index (a few KB) on the host,
  and all its zstd frames are decoded in **one** nvCOMP batch (``nvidia.nvcomp``) straight
  into the chunk. nvCOMP decodes each zstd frame on a small part of the GPU, so its rate
  comes from decoding many frames at once: a shard of hundreds of small inner chunks
  keeps the whole GPU busy;
* *read*, ``bytes`` + ``zstd`` without sharding (zarr's and xarray's default compressor,
  without checksum): one zstd frame per chunk. One frame decodes on nvCOMP at about
  0.1 GB/s (measured on an H100: 32 frames of 8 MiB, one at a time), slower than one host
  core, so such a chunk is read and decoded on the host and copied to the device once;
  write stores meant for GPU reads sharded (``shards=`` in zarr, ``"shards"`` in an
  xarray encoding) with small inner chunks;
* *read*, any other codec chain (blosc, gzip, big-endian, transpose, a checksum, ...):
  zarr decodes it with its CPU codecs into host memory and the chunk is copied to the
  device once;
* *write*: with KvikIO, the chunk's device bytes go straight to its file (edge chunks
  padded with the fill value, as zarr pads them; fill-only chunks skipped, as zarr skips
  them); without KvikIO, the chunk is copied to the host and zarr writes it. Whether a
  block is on the device is decided by the block itself, not by the dask array's
  ``meta`` (which says NumPy for many graphs that make CuPy chunks).

A user's own ``da.to_zarr`` / ``xarray.to_zarr`` of CuPy chunks goes through zarr; on GPU
workers zarr copies device chunks to the host as it takes them in (:mod:`.zarr_buffers`).

Whichever way a chunk goes, its values are the same bit for bit: uncompressed bytes are
the array's bytes, and zstd is lossless. Where KvikIO or nvCOMP is missing, or a chunk
file is not what the metadata says, the task falls back to zarr on the host and logs it
once per worker.

KvikIO and CuPy are imported only inside tasks that run on GPU workers; a CPU install
never imports them.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, replace

import numpy as np

logger = logging.getLogger("spillway.zarr_io")

#: chunk layouts the GPU path reads without zarr: "raw" (the bytes codec alone), "zstd"
#: (bytes + zstd without checksum) and "sharded" (a shard of raw or zstd inner chunks);
#: anything else is "codecs"
RAW, ZSTD, SHARDED, CODECS = "raw", "zstd", "sharded", "codecs"
#: fewest zstd frames in one nvCOMP batch for the GPU to decode faster than the host:
#: nvCOMP gives each frame a small part of the GPU (about 0.1 GB/s per frame on an H100)
GPU_MIN_FRAMES = 16
#: largest inner chunk sent to nvCOMP: its zstd compressor's largest chunk (16 MiB);
#: larger frames are decoded on the host
GPU_MAX_FRAME_BYTES = 16 * 2**20
#: an unused inner chunk in a shard index (zarr's sharding codec)
_MISSING = 2**64 - 1

#: KvikIO threads per worker process where ``KVIKIO_NTHREADS`` does not say: KvikIO's
#: default is one thread, which leaves a page-cached read at the speed of one memcpy
IO_THREADS = 16
#: bytes per KvikIO task (``KVIKIO_TASK_SIZE`` overrides): large enough that a chunk of
#: hundreds of MB is a few dozen tasks, small enough to spread over the threads
IO_TASK_BYTES = 16 * 2**20


def creation_kwargs(shape, chunks, dtype) -> dict:
    """What :func:`zarr.create_array` is given for an output, by both paths."""
    return {"shape": tuple(int(n) for n in shape), "chunks": tuple(int(c) for c in chunks),
            "dtype": np.dtype(dtype), "zarr_format": 3, "compressors": None}


# --- the layout of a stored array, as the workers need it


@dataclass(frozen=True)
class Layout:
    """Where a Zarr v3 array's chunks lie and how they are encoded: what a task needs to
    read or write one chunk file without opening the array (picklable, small)."""

    root: str
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    dtype: str
    #: the fill value as zarr decodes it (a Python scalar; NaN stays NaN)
    fill_value: float | int | bool
    #: RAW, ZSTD or CODECS
    encoding: str
    #: "default" (``c/0/1``) or "v2" (``0.1``) chunk keys, and their separator
    key_encoding: str = "default"
    separator: str = "/"
    #: SHARDED: the inner chunks' shape, their encoding (RAW or ZSTD) and where the index is
    inner_shape: tuple[int, ...] | None = None
    inner_encoding: str | None = None
    index_at_end: bool = True

    @property
    def inner_grid(self) -> tuple[int, ...]:
        """Inner chunks per shard along each dimension (one for an unsharded chunk)."""
        if self.inner_shape is None:
            return (1,) * len(self.chunk_shape)
        return tuple(c // i for c, i in zip(self.chunk_shape, self.inner_shape))

    @property
    def frames_per_chunk(self) -> int:
        return math.prod(self.inner_grid)

    @property
    def zstd(self) -> bool:
        return self.encoding == ZSTD or (self.encoding == SHARDED and self.inner_encoding == ZSTD)

    def gpu_decodes(self) -> bool:
        """Whether a chunk's zstd frames are enough for nvCOMP to beat the host."""
        inner = self.chunk_bytes // self.frames_per_chunk
        return self.zstd and self.frames_per_chunk >= GPU_MIN_FRAMES and inner <= GPU_MAX_FRAME_BYTES

    @property
    def chunk_bytes(self) -> int:
        return math.prod(self.chunk_shape) * np.dtype(self.dtype).itemsize

    def chunk_path(self, coords: tuple[int, ...]) -> str:
        """The file of the chunk at grid position ``coords``."""
        parts = [str(int(c)) for c in coords]
        if self.key_encoding == "default":
            key = self.separator.join(["c", *parts])
        else:
            key = self.separator.join(parts) if parts else "0"
        return os.path.join(self.root, *key.split("/"))

    def dask_chunks(self) -> tuple[tuple[int, ...], ...]:
        """One dask block per stored chunk (edge blocks cut to the array)."""
        return tuple(tuple(min(c, n - start) for start in range(0, n, c)) if n else (0,)
                     for n, c in zip(self.shape, self.chunk_shape))


def layout_of(array) -> Layout:
    """The :class:`Layout` of an open zarr v3 array on a local filesystem store."""
    meta = array.metadata
    root = _local_root(array)
    encoding = _encoding(meta.codecs, np.dtype(array.dtype))
    shard = _shard_of(meta.codecs, np.dtype(array.dtype)) if encoding == SHARDED else {}
    key = meta.chunk_key_encoding
    name = getattr(key, "name", None) or ("v2" if type(key).__name__.startswith("V2") else "default")
    return Layout(
        root=root,
        shape=tuple(int(n) for n in array.shape),
        # a shard is one file: the unit the workers read (zarr's ``chunks`` are its inner chunks)
        chunk_shape=tuple(int(c) for c in (getattr(array, "shards", None) or array.chunks)),
        dtype=np.dtype(array.dtype).name,
        fill_value=_python_scalar(meta.fill_value),
        encoding=encoding if root is not None else CODECS,
        key_encoding="v2" if name == "v2" else "default",
        separator=str(getattr(key, "separator", "/")),
        **shard,
    )


def _local_root(array) -> str | None:
    """The directory of a local store, else None (other stores go through zarr)."""
    store = array.store
    root = getattr(store, "root", None)
    if root is None or type(store).__name__ not in ("LocalStore", "GDSStore"):
        return None
    path = getattr(array, "path", "") or ""
    root = os.path.abspath(str(root))
    return os.path.join(root, *path.split("/")) if path else root


def _encoding(codecs, dtype: np.dtype) -> str:
    """RAW, ZSTD, SHARDED or CODECS for a v3 codec chain (see the module docstring)."""
    names = [type(c).__name__ for c in codecs]
    if names == ["ShardingCodec"]:
        return SHARDED if _shard_of(codecs, dtype) else CODECS
    if not names or names[0] != "BytesCodec" or dtype.kind not in "biuf":
        return CODECS
    endian = getattr(getattr(codecs[0], "endian", None), "value", getattr(codecs[0], "endian", None))
    if dtype.itemsize > 1 and (endian not in ("little", None) or sys.byteorder != "little"):
        return CODECS
    if names == ["BytesCodec"]:
        return RAW
    if len(names) == 2 and names[1] in ("ZstdCodec", "NvcompZstdCodec") and not getattr(codecs[1], "checksum", True):
        return ZSTD
    return CODECS


def _shard_of(codecs, dtype: np.dtype) -> dict:
    """The :class:`Layout` fields of a shard the direct path reads (inner chunks RAW or
    ZSTD, zarr's default index codecs: little-endian offsets and sizes, then a CRC32C),
    or {} for any other sharding."""
    (sharding,) = codecs
    inner = _encoding(sharding.codecs, dtype)
    index = [type(c).__name__ for c in sharding.index_codecs]
    where = str(getattr(sharding.index_location, "value", sharding.index_location))
    if inner not in (RAW, ZSTD) or index != ["BytesCodec", "Crc32cCodec"] or where not in ("start", "end"):
        return {}
    if _encoding(sharding.index_codecs[:1], np.dtype("<u8")) != RAW:
        return {}
    return {"inner_shape": tuple(int(c) for c in sharding.chunk_shape), "inner_encoding": inner,
            "index_at_end": where == "end"}


def _python_scalar(value):
    if value is None:
        return 0
    return np.asarray(value).item()


# --- reading


def open_array(path: str, backend: str):
    """A lazy dask array over the Zarr v3 array at ``path``: NumPy chunks through
    ``da.from_zarr`` for ``backend="numpy"``; for ``"cupy"``, one block per stored chunk,
    each read on the worker into device memory (see the module docstring)."""
    import dask.array as da

    if backend == "numpy":
        import zarr

        shards = getattr(zarr.open_array(path, mode="r"), "shards", None)
        # a block per shard: dask's default (a block per inner chunk) rereads a shard's
        # index for each of its inner chunks and makes hundreds of tasks per shard
        return da.from_zarr(path, chunks=shards) if shards else da.from_zarr(path)
    if backend != "cupy":
        raise ValueError(f"backend: {backend!r} is not one of numpy, cupy")
    import zarr
    from dask.base import tokenize

    from .backend import device_meta

    path = os.path.abspath(os.path.expanduser(path))
    stored = zarr.open_array(path, mode="r")
    layout = layout_of(stored)
    if layout.root is None:
        layout = replace(layout, root=os.path.abspath(path), encoding=CODECS)
    return chunk_reads(layout, device_meta(np.dtype(layout.dtype), len(layout.shape)),
                       "zarr-read-" + tokenize(layout, _version_stamp(path)))


def chunk_reads(layout: Layout, meta, name: str):
    """One :func:`read_chunk` task per stored chunk, as a dask array with ``meta``."""
    import dask.array as da

    return da.map_blocks(read_chunk, dtype=np.dtype(layout.dtype), chunks=layout.dask_chunks(), meta=meta,
                         name=name, layout=layout)


def _version_stamp(path: str) -> tuple:
    """Changes when the store is rewritten, so dask does not reuse an older read's keys."""
    try:
        st = os.stat(os.path.join(path, "zarr.json"))
        return (st.st_mtime_ns, st.st_size)
    except OSError:
        return ()


def read_chunk(layout: Layout, block_info=None):
    """The stored chunk of this dask block, as a CuPy array on this worker's GPU."""
    info = block_info[None]
    coords = tuple(info["chunk-location"])
    shape = tuple(info["chunk-shape"])
    direct = layout.encoding in (RAW, ZSTD, SHARDED)
    if direct and layout.zstd and not layout.gpu_decodes():
        # a few large zstd frames: a host core decodes them faster than nvCOMP (module docstring)
        try:
            return _to_device(read_direct(layout, coords, shape, HostIO()))
        except _Fallback as why:
            _note_fallback("direct read", f"chunk {coords} of {layout.root}: {why}; read through zarr on the host")
    elif direct and kvikio_available():
        try:
            return read_direct(layout, coords, shape, _gpu_io())
        except _Fallback as why:
            _note_fallback("direct read", f"chunk {coords} of {layout.root}: {why}; read through zarr on the host")
    elif direct:
        _note_fallback("no kvikio", "kvikio is not installed on this worker: Zarr chunks are read on the host and copied "
                       "(install spillway[cuda13] or [cuda12])")
    return _to_device(_read_with_zarr(layout, info["array-location"]))


class _Fallback(Exception):
    """This chunk cannot take the direct path; zarr on the host reads it instead."""


def read_direct(layout: Layout, coords, shape, io):
    """Read the chunk at ``coords`` without zarr: the whole file into a buffer of ``io``
    (device memory with KvikIO; host memory in the CPU tests of this logic), viewed as
    the chunk (decoded first if zstd; assembled from its inner chunks if a shard) and cut
    to ``shape`` at the array's edge. A missing file is the fill value, as in zarr."""
    path = layout.chunk_path(coords)
    dtype = np.dtype(layout.dtype)
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return io.xp.full(shape, layout.fill_value, dtype=dtype)
    if layout.encoding == SHARDED:
        chunk = _read_shard(layout, path, size, io)
    elif layout.encoding == RAW:
        if size != layout.chunk_bytes:
            raise _Fallback(f"file of {size} bytes, expected {layout.chunk_bytes}")
        chunk = io.read(path, size).view(dtype).reshape(layout.chunk_shape)
    else:
        out = io.xp.empty(layout.chunk_bytes, dtype=np.uint8)
        io.decode_zstd([io.read(path, size)], [out])
        chunk = out.view(dtype).reshape(layout.chunk_shape)
    if shape != layout.chunk_shape:
        chunk = io.xp.ascontiguousarray(chunk[tuple(slice(0, n) for n in shape)])
    return chunk


def shard_index(layout: Layout, path: str, size: int) -> np.ndarray:
    """The (offset, nbytes) of each inner chunk of a shard file, in C order over the
    inner chunks (``2**64 - 1`` twice for one not stored), read on the host and checked
    against the file's size and the index's CRC32C."""
    n = layout.frames_per_chunk
    index_bytes = 16 * n + 4
    if size < index_bytes:
        raise _Fallback(f"shard file of {size} bytes, smaller than its index ({index_bytes} bytes)")
    with open(path, "rb", buffering=0) as f:
        f.seek(size - index_bytes if layout.index_at_end else 0)
        raw = f.read(index_bytes)
    if len(raw) != index_bytes:
        raise _Fallback(f"read {len(raw)} of the index's {index_bytes} bytes")
    if _crc32c(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
        raise _Fallback("the shard index's CRC32C does not match")
    index = np.frombuffer(raw[:-4], dtype="<u8").reshape(n, 2)
    present = index[:, 0] != _MISSING
    ends = index[present, 0] + index[present, 1]
    if ends.size and int(ends.max()) > size:
        raise _Fallback("the shard index points past the end of the file")
    return index


def _crc32c(data: bytes) -> int:
    import google_crc32c  # what zarr's Crc32cCodec uses

    return int(google_crc32c.value(data))


def _read_shard(layout: Layout, path: str, size: int, io):
    """A whole shard as its chunk: the file read once, its zstd frames decoded in one
    batch straight into the inner chunks' places (raw inner chunks copied there); inner
    chunks not stored are the fill value, as zarr reads them."""
    xp = io.xp
    dtype = np.dtype(layout.dtype)
    index = shard_index(layout, path, size)
    n = layout.frames_per_chunk
    inner_bytes = math.prod(layout.inner_shape) * dtype.itemsize
    present = [i for i in range(n) if int(index[i, 0]) != _MISSING]
    make = xp.empty if len(present) == n else (lambda s, dtype: xp.full(s, layout.fill_value, dtype=dtype))
    staged = make((n, *layout.inner_shape), dtype=dtype)
    flat = staged.reshape(n, -1).view(np.uint8)
    data = io.read(path, size) if present else None
    frames = [data[int(index[i, 0]):int(index[i, 0] + index[i, 1])] for i in present]
    outs = [flat[i] for i in present]
    if layout.inner_encoding == ZSTD:
        io.decode_zstd(frames, outs)
    else:
        for frame, out in zip(frames, outs):
            if frame.size != inner_bytes:
                raise _Fallback(f"an inner chunk of {frame.size} bytes, expected {inner_bytes}")
            out[...] = frame
    return assemble(xp, staged, layout.inner_grid, layout.inner_shape)


def assemble(xp, staged, grid, inner):
    """The shard from its inner chunks ``staged`` (one per row, C order over ``grid``):
    a view where each inner chunk is a contiguous slab of the shard (inner chunks that
    split only the leading dimensions), else one copy that interleaves them."""
    shard = tuple(g * i for g, i in zip(grid, inner))
    split = [d for d, g in enumerate(grid) if g > 1]
    if not split or all(inner[d] == 1 for d in range(split[-1])):
        return staged.reshape(shard)
    nd = len(grid)
    order = [a for d in range(nd) for a in (d, nd + d)]
    return xp.ascontiguousarray(staged.reshape(*grid, *inner).transpose(order)).reshape(shard)


def _read_with_zarr(layout: Layout, location):
    import zarr

    region = tuple(slice(int(a), int(b)) for a, b in location)
    return zarr.open_array(layout.root, mode="r")[region]


def _to_device(block):
    import cupy

    return cupy.asarray(block)


# --- writing


def store(array, path: str):
    """A lazy dask collection that writes ``array`` to a new Zarr v3 store at ``path``
    (replacing one there), chunk by chunk on the workers; its chunks become the store's
    (irregular chunks are first made regular, as zarr needs). The store is created here
    (metadata only); each task writes its block: a device block straight from the device,
    a host block through zarr (see the module docstring)."""
    import zarr

    if not _regular(array.chunks):
        array = array.rechunk(tuple(max(c) for c in array.chunks))
    chunks = tuple(max(c[0], 1) for c in array.chunks)
    created = zarr.create_array(store=path, overwrite=True, **creation_kwargs(array.shape, chunks, array.dtype))
    layout = layout_of(created)
    ones = tuple((1,) * len(c) for c in array.chunks)
    written = array.map_blocks(write_chunk, layout=layout, dtype=np.int64, chunks=ones,
                               meta=np.empty((0,) * array.ndim, dtype=np.int64))
    return written.sum()


def _regular(chunks) -> bool:
    return all(len(set(c[:-1])) <= 1 and (len(c) == 1 or c[-1] <= c[0]) for c in chunks)


def _on_device(block) -> bool:
    return hasattr(block, "__cuda_array_interface__")


def write_chunk(block, layout: Layout, block_info=None):
    """Write one block to its chunk file; returns the bytes written (as a block of ones
    in every dimension, summed by :func:`store`). Decided by the block, not the graph's
    meta: a device block goes straight from the device with KvikIO (copied to the host
    and written by zarr without it), a host block is written by zarr."""
    info = block_info[0]
    coords = tuple(info["chunk-location"])
    ones = (1,) * block.ndim
    if _on_device(block) and kvikio_available():
        return np.full(ones, write_direct(layout, coords, block, _gpu_io()), dtype=np.int64)
    if _on_device(block):
        _note_fallback("no kvikio", "kvikio is not installed on this worker: Zarr chunks are copied to the host and "
                       "written by zarr (install spillway[cuda13] or [cuda12])")
    import zarr

    from .zarr_buffers import to_host

    region = tuple(slice(int(a), int(b)) for a, b in info["array-location"])
    host = to_host(block)
    zarr.open_array(layout.root, mode="r+")[region] = host
    return np.full(ones, host.nbytes, dtype=np.int64)


def write_direct(layout: Layout, coords, block, io) -> int:
    """Write ``block`` as the uncompressed chunk at ``coords`` without zarr, as zarr
    would: padded with the fill value at the array's edge, no file where the chunk holds
    only the fill value (unless zarr's ``array.write_empty_chunks`` is set). Returns the
    bytes written."""
    if layout.encoding != RAW:
        raise ValueError(f"{layout.root}: the direct writer writes uncompressed chunks, not {layout.encoding}")
    xp = io.xp
    dtype = np.dtype(layout.dtype)
    if tuple(block.shape) != layout.chunk_shape:
        padded = xp.full(layout.chunk_shape, layout.fill_value, dtype=dtype)
        padded[tuple(slice(0, n) for n in block.shape)] = block
        block = padded
    path = layout.chunk_path(coords)
    if not _write_empty_chunks() and all_fill(xp, block, layout.fill_value):
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


# --- the I/O of the direct path


class HostIO:
    """The direct path over host memory: plain reads and writes into NumPy buffers. The
    GPU path's logic (keys, edges, fill values, padding) runs through it in CPU tests."""

    xp = np

    def read(self, path: str, size: int):
        out = np.empty(size, dtype=np.uint8)
        with open(path, "rb", buffering=0) as f:
            got = f.readinto(memoryview(out))
        if got != size:
            raise _Fallback(f"read {got} of {size} bytes")
        return out

    def write(self, path: str, chunk) -> int:
        with open(path, "wb") as f:
            f.write(memoryview(np.ascontiguousarray(chunk)).cast("B"))
        return int(chunk.nbytes)

    def decode_zstd(self, frames, outs) -> None:
        """Each zstd frame decoded into its output (as many bytes as the output holds)."""
        from numcodecs import Zstd

        codec = Zstd()
        start = time.perf_counter()
        for frame, out in zip(frames, outs):
            decoded = np.frombuffer(codec.decode(frame), dtype=np.uint8)
            if decoded.size != out.size:
                raise _Fallback(f"a zstd frame decoded to {decoded.size} bytes, expected {out.size}")
            out[...] = decoded
        _count("host", sum(int(o.size) for o in outs), len(outs), time.perf_counter() - start)


class KvikIO:
    """The direct path over device memory: KvikIO reads and writes whole chunk files
    between the file and CuPy buffers (GDS, or POSIX through pinned bounce buffers with
    KvikIO's thread pool); nvCOMP decodes zstd on the device."""

    def __init__(self):
        import cupy
        import kvikio

        self.xp = cupy
        self.kvikio = kvikio
        self._zstd = None

    def read(self, path: str, size: int):
        out = self.xp.empty(size, dtype=self.xp.uint8)
        with self.kvikio.CuFile(path, "r") as f:
            got = f.read(out)
        if got != size:
            raise _Fallback(f"KvikIO read {got} of {size} bytes")
        return out

    def write(self, path: str, chunk) -> int:
        with self.kvikio.CuFile(path, "w") as f:
            return int(f.write(chunk.reshape(-1).view(self.xp.uint8)))

    def decode_zstd(self, frames, outs) -> None:
        """All ``frames`` (device views of zstd frames) decoded by nvCOMP in one batch into
        ``outs`` (device buffers of the decoded sizes): many frames at once is what keeps
        the GPU busy (module docstring). The frame headers are checked first: nvCOMP
        trusts its input, and a malformed frame can fail the CUDA context."""
        if not frames:
            return
        try:
            from nvidia import nvcomp
        except ImportError:
            raise _Fallback("nvCOMP (nvidia-nvcomp) is not installed: zstd is decoded on the host") from None
        cupy = self.xp
        start = time.perf_counter()
        check_zstd_headers(self._heads(frames), [int(o.size) for o in outs])
        if self._zstd is None:
            # one codec per thread (nvCOMP's codecs are not thread-safe) on a stream of its own:
            # a stream pointer of 0 lets nvCOMP create an internal stream that synchronizing
            # the default stream would not wait for; a blocking stream orders after the
            # default stream's work (the fill of missing inner chunks) without a sync
            self._stream = cupy.cuda.Stream(non_blocking=False)
            self._zstd = nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW,
                                      device_id=cupy.cuda.Device().id, cuda_stream=self._stream.ptr)
        ptr = self._stream.ptr
        try:
            src = nvcomp.as_arrays(list(frames), cuda_stream=ptr)
            self._decode_into(nvcomp, src, outs, ptr)
            self._stream.synchronize()
        except _Fallback:
            raise
        except Exception as e:  # nvCOMP raises its own types for streams it cannot decode
            raise _Fallback(f"nvCOMP could not decode it ({type(e).__name__}: {e})") from None
        _count("gpu", sum(int(o.size) for o in outs), len(outs), time.perf_counter() - start)

    #: how this nvCOMP takes preallocated outputs, once found: "list" (CuPy arrays),
    #: "arrays" (its own BatchArray) or "copy" (it allocates; the results are copied)
    _out_form: str | None = None

    def _decode_into(self, nvcomp, src, outs, ptr) -> None:
        """Decode the batch ``src`` into ``outs``. nvCOMP's Python API documents ``out``
        for the batch overload loosely; the forms are tried in order, once per process."""
        forms = [KvikIO._out_form] if KvikIO._out_form else ["list", "arrays", "copy"]
        error = None
        for form in forms:
            try:
                if form == "list":
                    got = self._zstd.decode(src, out=list(outs))
                elif form == "arrays":
                    got = self._zstd.decode(src, out=nvcomp.as_arrays(list(outs), cuda_stream=ptr))
                else:
                    got = self._zstd.decode(src)
                    for decoded, out in zip(got, outs):
                        flat = self.xp.asarray(decoded).view(self.xp.uint8).reshape(-1)
                        if flat.size != out.size:
                            raise _Fallback(f"a zstd frame decoded to {flat.size} bytes, expected {out.size}")
                        out[...] = flat
            except _Fallback:
                raise
            except Exception as e:  # this form refused (nvCOMP's own exception types): try the next
                error = e
                continue
            KvikIO._out_form = form
            for decoded, out in zip(got if form != "copy" and got is not None else (), outs):
                size = getattr(decoded, "buffer_size", None)
                if size is not None and int(size) != int(out.size):
                    raise _Fallback(f"a zstd frame decoded to {size} bytes, expected {out.size}")
                where = getattr(decoded, "__cuda_array_interface__", {}).get("data", (out.data.ptr,))[0]
                if where != out.data.ptr:  # decoded elsewhere than asked: copied into place
                    out[...] = self.xp.asarray(decoded).view(self.xp.uint8).reshape(-1)
            return
        raise error

    def _heads(self, frames) -> list[bytes]:
        """The first bytes of each frame (its header), in one copy to the host."""
        cupy = self.xp
        take = [min(_ZSTD_HEAD, int(f.size)) for f in frames]
        heads = cupy.asnumpy(cupy.concatenate([f[:k] for f, k in zip(frames, take)]))
        bounds = np.cumsum([0, *take])
        return [heads[bounds[i]:bounds[i + 1]].tobytes() for i in range(len(frames))]


#: enough bytes of a zstd frame to hold its header (magic, descriptor, window, dictionary
#: id, content size)
_ZSTD_HEAD = 18
_ZSTD_MAGIC = 0xFD2FB528


def zstd_content_size(header: bytes) -> int | None:
    """The decoded size a zstd frame's header states (None where it states none); raises
    :class:`_Fallback` for bytes that do not start a zstd frame (RFC 8878, 3.1.1)."""
    if len(header) < 5 or int.from_bytes(header[:4], "little") != _ZSTD_MAGIC:
        raise _Fallback("not a zstd frame")
    descriptor = header[4]
    size_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
    start = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single_segment else 0, 2, 4, 8)[size_flag]
    if width == 0:
        return None
    if len(header) < start + width:
        raise _Fallback("a truncated zstd frame header")
    value = int.from_bytes(header[start:start + width], "little")
    return value + 256 if width == 2 else value


def check_zstd_headers(heads: list[bytes], sizes: list[int]) -> None:
    """Every frame starts a zstd frame whose stated size, where stated, is the size its
    output holds (zarr's zstd codec states it)."""
    for head, size in zip(heads, sizes):
        stated = zstd_content_size(head)
        if stated is not None and stated != size:
            raise _Fallback(f"a zstd frame states {stated} bytes, expected {size}")


# --- what this process decoded (the bench reads it with describe())

_decoded = {"gpu": [0, 0, 0.0], "host": [0, 0, 0.0]}  # bytes, frames, seconds
_decoded_lock = threading.Lock()


def _count(where: str, nbytes: int, frames: int, seconds: float) -> None:
    with _decoded_lock:
        entry = _decoded[where]
        entry[0] += nbytes
        entry[1] += frames
        entry[2] += seconds


def decode_counters(dask_worker=None) -> dict:
    """Bytes decoded, frames and seconds spent decoding zstd, on the GPU (nvCOMP, until
    its stream finished) and on the host, since this process started."""
    with _decoded_lock:
        return {k: {"bytes": v[0], "frames": v[1], "seconds": v[2]} for k, v in _decoded.items()}


_local = threading.local()
_configured = threading.Lock()
_done: dict[str, bool] = {}
_noted: set[str] = set()


def kvikio_available() -> bool:
    """Whether KvikIO is installed here (no import)."""
    return importlib.util.find_spec("kvikio") is not None


def _gpu_io() -> KvikIO:
    """This thread's KvikIO reader; KvikIO's thread pool is set up once per process."""
    io = getattr(_local, "io", None)
    if io is None:
        with _configured:
            if not _done.get("kvikio"):
                configure_kvikio()
                _done["kvikio"] = True
        io = _local.io = KvikIO()
    return io


def configure_kvikio() -> None:
    """KvikIO's thread pool and task size for whole-chunk reads, unless the ``KVIKIO_*``
    environment variables say otherwise."""
    import kvikio.defaults

    wanted = {}
    if "KVIKIO_NTHREADS" not in os.environ:
        wanted["num_threads"] = max(1, min(IO_THREADS, os.cpu_count() or 1))
    if "KVIKIO_TASK_SIZE" not in os.environ:
        wanted["task_size"] = IO_TASK_BYTES
    if not wanted:
        return
    if hasattr(kvikio.defaults, "set"):
        kvikio.defaults.set(wanted)
    else:  # KvikIO before 25.02
        if "num_threads" in wanted:
            kvikio.defaults.num_threads_reset(wanted["num_threads"])
        if "task_size" in wanted:
            kvikio.defaults.task_size_reset(wanted["task_size"])


def _note_fallback(kind: str, message: str) -> None:
    """Log a fallback once per worker process and kind of reason."""
    if kind not in _noted:
        _noted.add(kind)
        logger.warning("spillway zarr I/O: %s", message)


def describe() -> dict:
    """What this process reads and writes Zarr chunks with on GPUs (run on a worker):
    KvikIO's version, whether it runs GDS or POSIX compat mode and with how many
    threads, and whether nvCOMP decodes zstd."""
    out = {"kvikio": None, "mode": "host codecs + copy to device", "threads": None, "nvcomp": _nvcomp_loads()}
    if not kvikio_available():
        return out
    try:
        import kvikio
        import kvikio.defaults

        _gpu_io()
        out["kvikio"] = getattr(kvikio, "__version__", "installed")
        compat = kvikio.defaults.get("compat_mode") if hasattr(kvikio.defaults, "get") else \
            kvikio.defaults.compat_mode()
        compat = str(getattr(compat, "name", compat)).upper()
        threads = kvikio.defaults.get("num_threads") if hasattr(kvikio.defaults, "get") else \
            kvikio.defaults.get_num_threads()
        out["mode"] = {"ON": "KvikIO POSIX (compat mode)", "TRUE": "KvikIO POSIX (compat mode)",
                       "OFF": "KvikIO GDS", "FALSE": "KvikIO GDS"}.get(compat, "KvikIO (GDS where the file allows)")
        out["threads"] = int(threads)
    except Exception as e:  # a broken CUDA setup: say so rather than fail the caller
        out["mode"] = f"KvikIO unusable ({type(e).__name__}: {e})"
    return out


def _has_nvidia() -> bool:
    return importlib.util.find_spec("nvidia") is not None


def _nvcomp_loads() -> bool:
    """Whether nvCOMP imports here: its module is found and its library loads (without
    the ``nvidia-libnvcomp`` wheel the import fails on ``libnvcomp.so``)."""
    if not _has_nvidia() or importlib.util.find_spec("nvidia.nvcomp") is None:
        return False
    try:
        from nvidia import nvcomp  # noqa: F401
    except ImportError as e:
        _note_fallback("no nvcomp", f"nvCOMP does not load ({e}): install spillway[cuda13] or [cuda12]")
        return False
    return True
