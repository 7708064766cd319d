"""Whole chunk files between a file and host memory: the direct path's reads, writes and
zstd decodes on NumPy buffers. A chunk of a few large zstd frames is read this way on
GPU workers too (one host core decodes a large frame faster than nvCOMP), then copied to
the device once."""

from __future__ import annotations

import time

import numpy as np

from .counters import count
from .fallback import Fallback


class HostIO:
    """The direct path over host memory: plain reads and writes into NumPy buffers. The
    GPU path's logic (keys, edges, fill values, padding) runs through it in CPU tests."""

    xp = np

    def read(self, path: str, size: int):
        out = np.empty(size, dtype=np.uint8)
        with open(path, "rb", buffering=0) as f:
            got = f.readinto(memoryview(out))
        if got != size:
            raise Fallback(f"read {got} of {size} bytes")
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
                raise Fallback(f"a zstd frame decoded to {decoded.size} bytes, expected {out.size}")
            out[...] = decoded
        count("host", sum(int(o.size) for o in outs), len(outs), time.perf_counter() - start)

