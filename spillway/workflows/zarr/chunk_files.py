"""Where a stored Zarr v3 array's chunk files lie and how they are encoded, read from its
metadata once on the client: the tasks that read or write a chunk file get a
:class:`ChunkFiles` and never open the array themselves."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

import numpy as np

from .pinned import Pin, open_key

#: chunk encodings the GPU path reads without zarr: "raw" (the bytes codec alone), "zstd"
#: (bytes + zstd without checksum) and "sharded" (a shard of raw or zstd inner chunks);
#: anything else is "codecs"
RAW, ZSTD, SHARDED, CODECS = "raw", "zstd", "sharded", "codecs"
#: fewest zstd frames in one nvCOMP batch for the GPU to decode faster than the host:
#: nvCOMP gives each frame a small part of the GPU (about 0.1 GB/s per frame on an H100)
GPU_MIN_FRAMES = 16
#: largest inner chunk sent to nvCOMP: its zstd compressor's largest chunk (16 MiB);
#: larger frames are decoded on the host
GPU_MAX_FRAME_BYTES = 16 * 2**20


@dataclass(frozen=True)
class ChunkFiles:
    """Where a Zarr v3 array's chunk files lie and how they are encoded: what a task needs
    to read or write one chunk file without opening the array (picklable, small).

    (Named for the files, not a "layout": the Slurm script and the memory groups have
    layouts of their own.)"""

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
    #: the store as checked: chunk files are then opened through it (:mod:`.pinned`),
    #: never by name, so a link swapped in reads nothing; None for stores spillway writes
    pin: Pin | None = None

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

    def chunk_key(self, coords: tuple[int, ...]) -> str:
        """The store key of the chunk at grid position ``coords`` (``c/0/1``)."""
        parts = [str(int(c)) for c in coords]
        if self.key_encoding == "default":
            return self.separator.join(["c", *parts])
        return self.separator.join(parts) if parts else "0"

    def chunk_path(self, coords: tuple[int, ...]) -> str:
        """The file of the chunk at grid position ``coords``."""
        return os.path.join(self.root, *self.chunk_key(coords).split("/"))

    def open_chunk(self, coords: tuple[int, ...]) -> int | None:
        """A read-only descriptor of the chunk's file, or None where it has none (the fill
        value): through the pinned store where there is one, else by name."""
        if self.pin is not None:
            return open_key(self.pin, self.chunk_key(coords))
        try:
            return os.open(self.chunk_path(coords), os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, IsADirectoryError):
            return None

    def dask_chunks(self) -> tuple[tuple[int, ...], ...]:
        """One dask block per stored chunk (edge blocks cut to the array)."""
        return tuple(tuple(min(c, n - start) for start in range(0, n, c)) if n else (0,)
                     for n, c in zip(self.shape, self.chunk_shape))


def chunk_files_of(array) -> ChunkFiles:
    """The :class:`ChunkFiles` of an open zarr v3 array on a local filesystem store."""
    meta = array.metadata
    root = _local_root(array)
    encoding = _encoding(meta.codecs, np.dtype(array.dtype))
    shard = _shard_of(meta.codecs, np.dtype(array.dtype)) if encoding == SHARDED else {}
    key = meta.chunk_key_encoding
    name = getattr(key, "name", None) or ("v2" if type(key).__name__.startswith("V2") else "default")
    return ChunkFiles(
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
    if root is None or type(store).__name__ not in ("LocalStore", "GDSStore", "PinnedStore"):
        return None
    path = getattr(array, "path", "") or ""
    root = os.path.abspath(str(root))
    return os.path.join(root, *path.split("/")) if path else root


def _encoding(codecs, dtype: np.dtype) -> str:
    """RAW, ZSTD, SHARDED or CODECS for a v3 codec chain (see the package docstring)."""
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
    """The :class:`ChunkFiles` fields of a shard the direct path reads (inner chunks RAW or
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

