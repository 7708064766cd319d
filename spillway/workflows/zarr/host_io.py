"""Whole chunk files between a file and host memory: the direct path's reads, writes and
zstd decodes on NumPy buffers. A chunk of a few large zstd frames is read this way on
GPU workers too, in the pool of :mod:`.host_decode` (one host core decodes a large frame
faster than nvCOMP), then copied to the device once."""

from __future__ import annotations

import os
import time

import numpy as np

from .counters import count, count_stage
from .fallback import Fallback
from .zstd import HEAD_BYTES, check_zstd_headers


class HostIO:
    """The direct path over host memory: plain reads and writes into NumPy buffers. The
    GPU path's logic (keys, edges, fill values, padding) runs through it in CPU tests.

    With ``buffers`` (a :class:`~.host_decode.BufferSet`), the buffers it reads and
    decodes into are taken from that set and handed back by :meth:`give_back`, once the
    chunk has been copied out of them."""

    xp = np

    def __init__(self, buffers=None, device_sink=None):
        self.buffers = buffers
        #: ``nbytes -> sink`` where a chunk of one zstd frame goes to the device as it is
        #: decoded (:mod:`.stream_decode`; the pool sets it), else None
        self.device_sink = device_sink
        #: whether the chunk returned is already on the device (streamed there)
        self.on_device = False
        self._taken: list[np.ndarray] = []

    def empty(self, nbytes: int, pinned: bool = True) -> np.ndarray:
        """A buffer for a decoded chunk (``pinned``: the device copies from it, so a
        pinned one is taken where the set has one) or for a file's bytes."""
        if self.buffers is None:
            return np.empty(nbytes, dtype=np.uint8)
        buffer = self.buffers.take(nbytes, pinned=pinned)
        self._taken.append(buffer)
        return buffer

    def give_back(self) -> None:
        taken, self._taken = self._taken, []
        for buffer in taken:
            self.buffers.give(buffer)

    def read(self, path: str, size: int):
        start = time.perf_counter()
        out = self.empty(size, pinned=False)
        fd = os.open(path, os.O_RDONLY)
        try:
            if hasattr(os, "posix_fadvise"):  # a whole file, front to back: read ahead far
                os.posix_fadvise(fd, 0, size, os.POSIX_FADV_SEQUENTIAL)
            got = os.readv(fd, [memoryview(out)])
            while 0 < got < size:  # a short read (signals, some filesystems)
                more = os.preadv(fd, [memoryview(out)[got:]], got)
                if more <= 0:
                    break
                got += more
        finally:
            os.close(fd)
        if got != size:
            raise Fallback(f"read {got} of {size} bytes")
        count_stage("read", size, time.perf_counter() - start)
        return out

    def write(self, path: str, chunk) -> int:
        with open(path, "wb") as f:
            f.write(memoryview(np.ascontiguousarray(chunk)).cast("B"))
        return int(chunk.nbytes)

    def decode_zstd_file(self, path: str, size: int, nbytes: int):
        """The chunk file at ``path``, one zstd frame of ``nbytes``, decoded: streamed to
        the device piece by piece while it is read where the pool gave a ``device_sink``
        (the device array is returned), else read whole and decoded whole into a host
        buffer."""
        if self.device_sink is not None:
            from .stream_decode import decode_file

            chunk = decode_file(path, size, nbytes, self, self.device_sink(nbytes))
            self.on_device = True
            return chunk
        out = self.empty(nbytes)
        self.decode_zstd([self.read(path, size)], [out])
        return out

    def decode_zstd(self, frames, outs) -> None:
        """Each zstd frame decoded straight into its output (as many bytes as the output
        holds, which its header must state): no copy of the decoded bytes."""
        from numcodecs import Zstd

        codec = Zstd()
        start = time.perf_counter()
        check_zstd_headers([bytes(f[:HEAD_BYTES]) for f in frames], [int(o.size) for o in outs])
        for frame, out in zip(frames, outs):
            try:
                decoded = codec.decode(frame, out=out)
            except Exception as e:  # numcodecs raises RuntimeError for a corrupt frame
                raise Fallback(f"zstd could not decode a frame ({type(e).__name__}: {e})") from None
            got = np.frombuffer(decoded, dtype=np.uint8) if not isinstance(decoded, np.ndarray) else decoded
            if got.nbytes != out.nbytes or got.ctypes.data != out.ctypes.data:
                raise Fallback(f"a zstd frame decoded to {got.nbytes} bytes, expected {out.nbytes}")
        seconds = time.perf_counter() - start
        nbytes = sum(int(o.size) for o in outs)
        count("host", nbytes, len(outs), seconds)
        count_stage("decode", nbytes, seconds)
