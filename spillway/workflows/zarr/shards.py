"""Shards (zarr's ``sharding_indexed`` codec): a shard file's index, read and checked on
the host, and the whole shard assembled from its inner chunks, its zstd frames decoded in
one batch (on the GPU with nvCOMP: many frames at once are what keeps it busy)."""

from __future__ import annotations

import math

import numpy as np

from .chunk_files import ZSTD, ChunkFiles
from .fallback import Fallback

#: an unused inner chunk in a shard index (zarr's sharding codec)
MISSING = 2**64 - 1


def shard_index(files: ChunkFiles, path: str, size: int) -> np.ndarray:
    """The (offset, nbytes) of each inner chunk of a shard file, in C order over the
    inner chunks (``2**64 - 1`` twice for one not stored), read on the host and checked
    against the file's size and the index's CRC32C."""
    n = files.frames_per_chunk
    index_bytes = 16 * n + 4
    if size < index_bytes:
        raise Fallback(f"shard file of {size} bytes, smaller than its index ({index_bytes} bytes)")
    with open(path, "rb", buffering=0) as f:
        f.seek(size - index_bytes if files.index_at_end else 0)
        raw = f.read(index_bytes)
    if len(raw) != index_bytes:
        raise Fallback(f"read {len(raw)} of the index's {index_bytes} bytes")
    if _crc32c(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
        raise Fallback("the shard index's CRC32C does not match")
    index = np.frombuffer(raw[:-4], dtype="<u8").reshape(n, 2)
    present = index[:, 0] != MISSING
    ends = index[present, 0] + index[present, 1]
    if ends.size and int(ends.max()) > size:
        raise Fallback("the shard index points past the end of the file")
    return index


def _crc32c(data: bytes) -> int:
    import google_crc32c  # what zarr's Crc32cCodec uses

    return int(google_crc32c.value(data))


def read_shard(files: ChunkFiles, path: str, size: int, io):
    """A whole shard as its chunk: the file read once, its zstd frames decoded in one
    batch straight into the inner chunks' places (raw inner chunks copied there); inner
    chunks not stored are the fill value, as zarr reads them."""
    xp = io.xp
    dtype = np.dtype(files.dtype)
    index = shard_index(files, path, size)
    n = files.frames_per_chunk
    inner_bytes = math.prod(files.inner_shape) * dtype.itemsize
    present = [i for i in range(n) if int(index[i, 0]) != MISSING]
    make = xp.empty if len(present) == n else (lambda s, dtype: xp.full(s, files.fill_value, dtype=dtype))
    staged = make((n, *files.inner_shape), dtype=dtype)
    flat = staged.reshape(n, -1).view(np.uint8)
    data = io.read(path, size) if present else None
    frames = [data[int(index[i, 0]):int(index[i, 0] + index[i, 1])] for i in present]
    outs = [flat[i] for i in present]
    if files.inner_encoding == ZSTD:
        io.decode_zstd(frames, outs)
    else:
        for frame, out in zip(frames, outs):
            if frame.size != inner_bytes:
                raise Fallback(f"an inner chunk of {frame.size} bytes, expected {inner_bytes}")
            out[...] = frame
    return assemble(xp, staged, files.inner_grid, files.inner_shape)


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
