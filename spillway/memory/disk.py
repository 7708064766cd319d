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
(:class:`~spillway.options.errors.SpillDiskFull`).

The tier knows its write and read rates (:meth:`DiskTier.rates`), for the scheduler to
say how long a graph past device + host will spend on the disk: from its own spills as
they happen (the values' bytes over the seconds of their writes and reads, all of them
so far), and until spills have moved enough to say, from a probe of the spill
filesystem that the worker runs once when it starts (:meth:`DiskTier.start_probe`).
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from .codecs import Alloc, HostCopy
from .tier import FULL, is_full

__all__ = ["FULL", "DiskTier", "is_full", "probe_rates"]

PIECE = 64 * 2**20
#: bytes of a value compressed first to decide whether the rest is; and the stored
#: fraction a sample (or a piece) must come under to be kept compressed
SAMPLE = 4 * 2**20
#: values smaller than this are written as they are
SMALLEST = 64 * 2**10
WORTH = 0.95
#: bytes the probe writes (fsynced) and reads back (out of the page cache), in pieces
PROBE_BYTES = 32 * 2**20
PROBE_PIECE = 4 * 2**20
#: bytes the spills must have moved one way before their rate replaces the probe's: a few
#: small writes time the page cache and the calls' overhead more than the disk
SPILLS_SAY = PROBE_BYTES

logger = logging.getLogger("spillway.memory")


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


class Throughput:
    """Bytes over the seconds they took, summed since the tier began (thread-safe: the
    store's moves and its prefetch thread both read and write)."""

    def __init__(self):
        self.nbytes = 0
        self.seconds = 0.0
        self._lock = threading.Lock()

    def add(self, nbytes: int, seconds: float) -> None:
        with self._lock:
            self.nbytes += int(nbytes)
            self.seconds += max(0.0, seconds)

    def rate(self) -> float:
        """Bytes per second (0.0 before any)."""
        with self._lock:
            return self.nbytes / self.seconds if self.seconds > 0 and self.nbytes > 0 else 0.0


class DiskTier:
    """Spilled segments in files (a :class:`~spillway.memory.tier.SegmentTier`),
    in a directory of its own under ``directory``; ``limit``: bytes its files may hold
    (None: what the filesystem has room for), ``name``: its name in the store's stack."""

    def __init__(self, directory: str | None, threads: int = 4, compress: bool = True, *,
                 limit: int | None = None, name: str = "disk"):
        root = directory or tempfile.gettempdir()
        os.makedirs(root, exist_ok=True)
        self.name = name
        self.limit = limit
        self.directory = tempfile.mkdtemp(prefix="spillway-spill-", dir=root)
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="spillway-disk")
        self.compress = compress
        self.meta: dict = {}
        #: bytes the tier's files hold (compressed values at their compressed size)
        self.nbytes = 0
        #: bytes of the values they hold
        self.raw_nbytes = 0
        self._names = itertools.count()
        #: guards ``meta`` and the byte counts: the store's drain writes on a thread of its
        #: own beside the spills' and restores' calls (each call a key of its own)
        self._books = threading.Lock()
        #: the values' bytes the spills wrote and read, and the seconds it took (a value
        #: that compresses counts its own bytes: the rate is in values, as the scheduler
        #: counts what goes to disk)
        self.writes = Throughput()
        self.reads = Throughput()
        #: (write, read) bytes per second the probe measured; None until it has
        self.probed: tuple[float, float] | None = None
        self._probe: threading.Thread | None = None

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

    @property
    def where(self) -> str:
        return self.directory

    def room(self) -> int:
        """Bytes more its files can take: the filesystem's free bytes, within its limit."""
        free = self.free_bytes()
        return free if self.limit is None else max(0, min(free, self.limit - self.nbytes))

    # --- the file layer (a test stand-in replaces these to run out of room)

    def _pwrite(self, fd: int, data, offset: int) -> None:
        _write_all(fd, memoryview(data).cast("B"), offset)

    def _each(self, fn, items) -> list:
        """``fn`` of every item on the pool; returns once every one has ended (none is
        left writing to a file descriptor that is closed and maybe reused, or reading
        into a buffer given back), raising the first error."""
        from concurrent.futures import wait

        futures = [self.pool.submit(fn, item) for item in items]
        wait(futures)
        return [f.result() for f in futures]

    # --- values

    def put(self, key, copy: HostCopy, itemsize: int = 8) -> None:
        """Write ``copy`` under ``key`` (``itemsize``: the element size of what its bytes
        hold, which the shuffle before compression groups by)."""
        path = self._path(key)
        start = time.perf_counter()
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
        self.writes.add(copy.nbytes, time.perf_counter() - start)
        with self._books:
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

    def get(self, key, alloc: Alloc) -> HostCopy:
        entry = self.meta[key]
        path, nbytes = entry.path, entry.nbytes
        buf = alloc(nbytes)
        start = time.perf_counter()
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
        self.reads.add(nbytes, time.perf_counter() - start)
        return HostCopy(entry.shape, np.dtype(entry.dtype), entry.order, buf)

    def delete(self, key) -> None:
        with self._books:
            entry = self.meta.pop(key)
            self.nbytes -= entry.stored
            self.raw_nbytes -= entry.nbytes
        _unlink(entry.path)

    # --- its rates

    def rates(self) -> dict:
        """Bytes per second the tier writes and reads values at, and where each figure
        comes from: its spills once they have moved :data:`SPILLS_SAY` bytes that way,
        else the probe, else what spills there were ("spills", "probe"; 0.0 and None
        before either)."""
        probed = self.probed or (0.0, 0.0)
        out = {}
        for way, moved, probe in (("write", self.writes, probed[0]), ("read", self.reads, probed[1])):
            spills = moved.rate()
            if spills and (moved.nbytes >= SPILLS_SAY or not probe):
                out[way], out[f"{way}_from"] = spills, "spills"
            elif probe:
                out[way], out[f"{way}_from"] = probe, "probe"
            else:
                out[way], out[f"{way}_from"] = 0.0, None
        return out

    def start_probe(self) -> threading.Thread | None:
        """Probe the spill filesystem once, on a thread of its own (the worker's event
        loop and the spills' pool go on meanwhile); a second call does nothing."""
        if self._probe is not None:
            return None
        self._probe = threading.Thread(target=self._run_probe, name="spillway-disk-probe", daemon=True)
        self._probe.start()
        return self._probe

    def _run_probe(self) -> None:
        # the probe's file lies beside the tier's directory, on the same filesystem: the
        # tier's own room and files stay what its values make them
        try:
            self.probed = probe_rates(os.path.dirname(self.directory))
        except Exception as e:  # noqa: BLE001 - a worker never fails for its probe
            logger.info("the spill disk's rate was not probed in %s (%s): it is measured from spills alone",
                        self.directory, e)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        shutil.rmtree(self.directory, ignore_errors=True)


def probe_rates(directory: str, nbytes: int = PROBE_BYTES, piece: int = PROBE_PIECE) -> tuple[float, float]:
    """(write, read) bytes per second of the filesystem of ``directory``: ``nbytes`` of
    random bytes (a compressing filesystem writes zeros at no cost) written in pieces of
    ``piece`` and fsynced, dropped from the page cache, read back; the file is removed
    whatever happens.

    Against a long spill, the write figure is an upper bound: a spill writes without
    fsync, so its first gigabytes go to the page cache at memory speed, but past the
    kernel's dirty limit it waits for the device, and a few tens of megabytes also fit
    the drive's own fast write cache (an SSD's SLC, a controller's RAM) that a spill of
    many gigabytes outruns; the probe also has the disk alone, where a spill shares it
    with the worker's reads and the other workers of the machine. A long spill is thus
    slower, and the seconds said from the probe are a floor. The read figure is about the
    device's (its pages dropped first), and a lower bound where a spill reads back values
    still in the page cache (which a spill past device + host and the page cache mostly
    does not) or reads on several threads where the probe reads on one. The spills' own
    figure replaces both once they have moved enough."""
    fd, path = tempfile.mkstemp(prefix="spillway-probe-", dir=directory)
    try:
        block = os.urandom(min(piece, nbytes))
        offsets = range(0, nbytes, len(block))
        start = time.perf_counter()
        for off in offsets:
            _write_all(fd, memoryview(block)[: nbytes - off], off)
        os.fsync(fd)
        write = nbytes / max(time.perf_counter() - start, 1e-9)
        _drop_cached(fd)
        buf = bytearray(len(block))
        start = time.perf_counter()
        for off in offsets:
            want = min(len(block), nbytes - off)
            got = os.preadv(fd, [memoryview(buf)[:want]], off)
            if got != want:
                raise OSError(f"short read from {path}: {got} bytes at {off}")
        read = nbytes / max(time.perf_counter() - start, 1e-9)
    finally:
        os.close(fd)
        _unlink(path)
    return write, read


def _write_all(fd: int, view: memoryview, offset: int) -> None:
    while len(view):
        n = os.pwrite(fd, view, offset)
        if n <= 0:  # pragma: no cover - a filesystem that writes nothing and says nothing
            raise OSError(errno.EIO, "write returned 0")
        view, offset = view[n:], offset + n


def _drop_cached(fd: int) -> None:
    """Drop the file's pages from the page cache, so the read back times the device
    (where the platform cannot, it times the cache: the read figure is then high)."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        try:
            advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
