"""The disk tier: host copies written to files in the worker's local directory.

Large buffers are written and read in pieces by a small thread pool, so one spill uses
several I/O queues at once (file I/O releases the GIL).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .codecs import Alloc, HostCopy

PIECE = 64 * 2**20


class DiskTier:
    def __init__(self, directory: str | None, threads: int = 4):
        root = directory or tempfile.gettempdir()
        os.makedirs(root, exist_ok=True)
        self.directory = tempfile.mkdtemp(prefix="spillway-spill-", dir=root)
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="spillway-disk")
        self.meta: dict = {}
        self.nbytes = 0
        self._names = itertools.count()

    def _path(self, key) -> str:
        return os.path.join(self.directory, f"{next(self._names):08d}")

    def __contains__(self, key) -> bool:
        return key in self.meta

    def write(self, key, copy: HostCopy) -> None:
        path = self._path(key)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(copy.buffer)
            list(self.pool.map(lambda off: os.pwrite(fd, view[off : off + PIECE], off),
                               range(0, copy.nbytes, PIECE)))
        finally:
            os.close(fd)
        self.meta[key] = (path, copy.shape, copy.dtype, copy.order, copy.nbytes)
        self.nbytes += copy.nbytes

    def read(self, key, alloc: Alloc) -> HostCopy:
        path, shape, dtype, order, nbytes = self.meta[key]
        buf = alloc(nbytes)
        fd = os.open(path, os.O_RDONLY)
        try:
            def piece(off):
                got = os.preadv(fd, [memoryview(buf)[off : off + PIECE]], off)
                if got != min(PIECE, nbytes - off):
                    raise OSError(f"short read from {path}: {got} bytes at {off}")

            list(self.pool.map(piece, range(0, nbytes, PIECE)))
        finally:
            os.close(fd)
        return HostCopy(shape, np.dtype(dtype), order, buf)

    def delete(self, key) -> None:
        path, *_, nbytes = self.meta.pop(key)
        self.nbytes -= nbytes
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        shutil.rmtree(self.directory, ignore_errors=True)
