"""The disk tier: host copies written to files in the worker's local directory.

Large buffers are written and read in pieces by a small thread pool, so one spill uses
several I/O queues at once (file I/O releases the GIL).

Values that compress are written compressed (Blosc's LZ4 with a byte shuffle, from
numcodecs, which zarr brings): each piece is compressed by the thread that writes it, and
a value is tried first on a sample, so one that does not compress (random mantissas save
about a tenth) costs one sample's compression and is written as it is where that saves
too little. :attr:`DiskTier.nbytes` counts what the files hold (the stored size), and
:attr:`DiskTier.raw_nbytes` the values' own bytes: the tiers' capacity is counted at the
stored size.

A write that fails leaves nothing behind: the file it began is removed and the value
stays where it was (in its host buffer). A full disk (``ENOSPC``, ``EDQUOT``) is raised as
the :class:`OSError` it is; the store turns it into one line that names the tiers
(:class:`~spillway.cluster.errors.SpillDiskFull`).
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from .codecs import Alloc, HostCopy

PIECE = 64 * 2**20
#: bytes of a value compressed first to decide whether the rest is; and the stored
#: fraction a sample (or a piece) must come under to be kept compressed
SAMPLE = 4 * 2**20
#: values smaller than this are written as they are
SMALLEST = 64 * 2**10
WORTH = 0.95
#: errors that say the filesystem has no room for what the tier writes
FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_full(error: BaseException) -> bool:
    """Whether ``error`` is a filesystem that ran out of room (or quota)."""
    return isinstance(error, OSError) and error.errno in FULL


class Stored(NamedTuple):
    """Where a value lies on disk: its file, the shape it is read back as, its bytes, the
    bytes the file holds, and for a compressed value each piece's (offset in the file,
    stored bytes, compressed or not) in the value's order."""

    path: str
    shape: tuple
    dtype: object
    order: str
    nbytes: int
    stored: int
    pieces: list | None = None


def _compressor(compress, itemsize: int):
    if not compress:
        return None
    try:
        from numcodecs import Blosc
    except ImportError:  # no numcodecs: values are written as they are
        return None
    return Blosc(cname="lz4", clevel=1, shuffle=Blosc.SHUFFLE, typesize=max(1, min(int(itemsize), 16)))


class DiskTier:
    def __init__(self, directory: str | None, threads: int = 4, compress: bool = True):
        root = directory or tempfile.gettempdir()
        os.makedirs(root, exist_ok=True)
        self.directory = tempfile.mkdtemp(prefix="spillway-spill-", dir=root)
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="spillway-disk")
        self.compress = compress
        self.meta: dict = {}
        #: bytes the tier's files hold (compressed values at their compressed size)
        self.nbytes = 0
        #: bytes of the values they hold
        self.raw_nbytes = 0
        self._names = itertools.count()

    def _path(self, key) -> str:
        return os.path.join(self.directory, f"{next(self._names):08d}")

    def __contains__(self, key) -> bool:
        return key in self.meta

    def usage(self) -> tuple[int, int]:
        """(total, free) bytes of the filesystem the tier writes to."""
        usage = shutil.disk_usage(self.directory)
        return int(usage.total), int(usage.free)

    def free_bytes(self) -> int:
        """Bytes free on the filesystem the tier writes to."""
        return self.usage()[1]

    # --- the file layer (a test stand-in replaces these to run out of room)

    def _pwrite(self, fd: int, data, offset: int) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            n = os.pwrite(fd, view, offset)
            if n <= 0:  # pragma: no cover - a filesystem that writes nothing and says nothing
                raise OSError(errno.EIO, "write returned 0")
            view, offset = view[n:], offset + n

    def _each(self, fn, items) -> list:
        """``fn`` of every item on the pool; returns once every one has ended (none is
        left writing to a file descriptor that is closed and maybe reused, or reading
        into a buffer given back), raising the first error."""
        from concurrent.futures import wait

        futures = [self.pool.submit(fn, item) for item in items]
        wait(futures)
        return [f.result() for f in futures]

    # --- values

    def write(self, key, copy: HostCopy, itemsize: int = 8) -> None:
        """Write ``copy`` under ``key`` (``itemsize``: the element size of what its bytes
        hold, which the shuffle before compression groups by)."""
        path = self._path(key)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(copy.buffer).cast("B")
            codec = self._worth_compressing(view, itemsize)
            if codec is None:
                self._each(lambda off: self._pwrite(fd, view[off : off + PIECE], off), range(0, copy.nbytes, PIECE))
                pieces, stored = None, copy.nbytes
            else:
                pieces, stored = self._write_compressed(fd, view, codec)
        except BaseException:
            os.close(fd)
            _unlink(path)
            raise
        os.close(fd)
        self.meta[key] = Stored(path, copy.shape, copy.dtype, copy.order, copy.nbytes, stored, pieces)
        self.nbytes += stored
        self.raw_nbytes += copy.nbytes

    def _worth_compressing(self, view: memoryview, itemsize: int):
        codec = _compressor(self.compress, itemsize)
        if codec is None or len(view) < SMALLEST:
            return None
        sample = view[:SAMPLE]
        return codec if len(codec.encode(sample)) <= WORTH * len(sample) else None

    def _write_compressed(self, fd: int, view: memoryview, codec) -> tuple[list, int]:
        """Each piece compressed and written by a pool thread at the next free offset (the
        order of the pieces in the file is the order they were done in)."""
        lock = threading.Lock()
        end = [0]

        def piece(off: int):
            raw = view[off : off + PIECE]
            data = codec.encode(raw)
            compressed = len(data) < WORTH * len(raw)
            if not compressed:
                data = raw
            with lock:
                at = end[0]
                end[0] += len(data)
            self._pwrite(fd, data, at)
            return at, len(data), compressed

        pieces = self._each(piece, range(0, len(view), PIECE))
        return pieces, end[0]

    def read(self, key, alloc: Alloc) -> HostCopy:
        entry = self.meta[key]
        path, nbytes = entry.path, entry.nbytes
        buf = alloc(nbytes)
        fd = os.open(path, os.O_RDONLY)
        try:
            if entry.pieces is None:
                def piece(off):
                    got = os.preadv(fd, [memoryview(buf)[off : off + PIECE]], off)
                    if got != min(PIECE, nbytes - off):
                        raise OSError(f"short read from {path}: {got} bytes at {off}")

                self._each(piece, range(0, nbytes, PIECE))
            else:
                codec = _compressor(True, 1)  # a Blosc frame says its own typesize

                def compressed_piece(item):
                    i, (at, length, compressed) = item
                    out = buf[i * PIECE : min(nbytes, (i + 1) * PIECE)]
                    if not compressed:
                        got = os.preadv(fd, [memoryview(out)], at)
                        if got != length:
                            raise OSError(f"short read from {path}: {got} bytes at {at}")
                        return
                    data = os.pread(fd, length, at)
                    if len(data) != length:
                        raise OSError(f"short read from {path}: {len(data)} bytes at {at}")
                    codec.decode(data, out=out)

                self._each(compressed_piece, enumerate(entry.pieces))
        finally:
            os.close(fd)
        return HostCopy(entry.shape, np.dtype(entry.dtype), entry.order, buf)

    def delete(self, key) -> None:
        entry = self.meta.pop(key)
        self.nbytes -= entry.stored
        self.raw_nbytes -= entry.nbytes
        _unlink(entry.path)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        shutil.rmtree(self.directory, ignore_errors=True)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
