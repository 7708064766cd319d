"""Chunks of a few large zstd frames (zarr's and xarray's default store: one frame per
chunk, no shards), read and decoded on the host by a pool of threads, many chunks at
once, and copied to the device.

Why a pool: a zstd frame decodes on one core (its blocks depend on the ones before, so
neither zstd nor nvCOMP splits one frame over threads; nvCOMP gives a frame a small part
of the GPU, about 0.1 GB/s), and a worker has one task thread: a 365-day chunk of a
0.25 degree grid (1.5 GB, one frame) took seconds on that thread while the host's other
cores idled. The only parallelism such a store offers is between chunks, so several
chunk reads must be in flight per worker.

How they get in flight: the read task hands its chunk to the pool and *secedes* from the
worker's thread pool while it waits (``distributed.secede``). The scheduler then counts
it as long-running and sends the worker its next tasks, which are the next chunk reads
(read tasks have no inputs: they are the graph's roots, which the scheduler queues and
hands out as threads free up). So the chunks read ahead are exactly the ones the graph
needs on this worker, in the scheduler's order, and compute on the chunks already read
runs on the worker's thread meanwhile. Outside a worker (dask's threaded scheduler, the
tests) the task waits on the pool in its own thread.

Each chunk in the pool, going to the device: decoded while it is read, in pieces
(:mod:`.stream_decode`): the file read a piece at a time (the kernel fetching the next
pieces meanwhile), its frame header checked, each piece decoded by python-zstandard
(libzstd, GIL released) into one of two small staging buffers and copied to the device on
the thread's own stream while the next piece decodes (:class:`DeviceSink`). So the read,
the decode and the copy of one chunk overlap, and the decoder writes into buffers that
stay in the CPU's cache. Without python-zstandard, or for a NumPy copy
(``to_device=False``), the whole-chunk path: the file read whole into a host buffer,
decoded by numcodecs straight into a second one of the chunk's size, that copied to the
device. On a worker with spillway's tiered store the buffers the device copies from
(staging pieces, or the whole decoded chunk) are slices of the store's pinned arena while
the arena has room (counted there as arena bytes in use until the copy is done), so the
copy runs at the pinned rate without pinning anything. Host
buffers are reused (a fresh buffer costs a page fault per 4 KB page on first touch, which
on a 1.5 GB chunk halves the decode rate). Buffers come from a bounded set per process
(:class:`BufferSet`): the reads in flight wait for room rather than take more than
:data:`BUFFER_SHARE` of the host's memory; the set's bytes are in :func:`buffer_counts`
(and ``decode_counters()["host_buffers"]``). They are ordinary process memory, so the
tiered store's host check, which reads the memory the machine has available, sees them
and spills to disk before the host runs out.

Each stage's seconds are counted (:mod:`.counters`: read, decode, copy), so a run says
where the time of getting the bytes into the GPU went."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from spillway.options.settings import worker_value

from .counters import count_stage

#: most host-decode threads per worker process (cores beyond it go to other workers)
MAX_THREADS = 16
#: share of the host's memory one GPU's worker may hold in decode buffers (each read in
#: flight's file and decoded chunk, or its pieces and decoder window, and those kept for reuse)
BUFFER_SHARE = 0.25
#: and at most this many bytes, whatever the host
MAX_BUFFER_BYTES = 24 * 2**30
#: idle seconds after which the kept buffers are given back to the system
IDLE_RELEASE_S = 30.0


def _threads() -> int:
    chosen = worker_value("zarr_decode_threads")
    if chosen:
        return chosen
    try:
        cores = len(os.sched_getaffinity(0))  # dask-cuda pins a GPU's worker to its NUMA node's cores
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cores))


def _budget() -> int:
    chosen = worker_value("zarr_decode_buffer_bytes")
    if chosen:
        return chosen
    from spillway.memory.growth import host_total

    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    share = BUFFER_SHARE / max(1, len(visible))  # one worker per GPU on this host
    return int(min(MAX_BUFFER_BYTES, share * host_total()))


def size_class(nbytes: int) -> int:
    """``nbytes`` rounded up to a sixteenth of its power of two (at least 64 KiB): the
    compressed files of a store's chunks differ by a few percent in size, and buffers
    are reused between sizes of one class."""
    step = max(2**16, (1 << max(0, int(nbytes - 1).bit_length())) // 16)
    return -(-nbytes // step) * step


class BufferSet:
    """Host buffers for reads in flight, reused between chunks, within ``budget`` bytes:
    each read first reserves the bytes it will take (:meth:`reserve` waits for room),
    then takes its buffers without waiting; kept buffers are dropped to make room."""

    def __init__(self, budget: int, alloc: Callable[[int], np.ndarray] | None = None, pinned=None):
        self.budget = int(budget)
        self._alloc = alloc or (lambda n: np.empty(n, dtype=np.uint8))
        #: the tiered store's host buffers (:class:`~spillway.memory.host.HostBuffers`)
        #: on a worker that has one: buffers that go to the device are slices of its
        #: pinned arena while it has room (already pinned: the copy runs at the pinned rate,
        #: with no pinning cost), counted in the store's summary as arena bytes in use
        self.pinned = pinned
        self._from_arena: set[int] = set()
        self._lent: dict[int, np.ndarray] = {}  # a view handed out -> its whole buffer
        self.arena_taken = 0  # bytes of arena slices handed out since the start
        self._free: dict[int, list[np.ndarray]] = {}
        self.in_use = 0
        self.kept = 0
        self.reserved = 0  # bytes the reads in flight may take (:meth:`reserve`)
        self.peak = 0
        self.allocated = 0  # bytes of buffers made (not reused) since the start
        self._cond = threading.Condition()

    @property
    def held(self) -> int:
        return self.in_use + self.kept

    def reserve(self, nbytes: int) -> None:
        """Wait until ``nbytes`` more fit the budget beside the reads in flight (a read
        alone always proceeds, however large its chunk, so none waits forever)."""
        with self._cond:
            while self.reserved and self.reserved + nbytes > self.budget:
                self._cond.wait()
            self.reserved += nbytes

    def unreserve(self, nbytes: int) -> None:
        with self._cond:
            self.reserved -= nbytes
            self._cond.notify_all()

    def take(self, nbytes: int, pinned: bool = False) -> np.ndarray:
        """A buffer of ``nbytes``; ``pinned``: one the device copies from (an arena slice
        where the store's arena has room, else as any other)."""
        arena = getattr(self.pinned, "arena", None) if pinned else None
        if arena is not None:
            view = arena.allocate(nbytes)
            if view is not None:
                with self._cond:
                    self._from_arena.add(view.ctypes.data)
                    self.in_use += nbytes
                    self.arena_taken += nbytes
                    self.peak = max(self.peak, self.held)
                return view
        if pinned and self.pinned is not None:
            self.pinned.missed_arena()  # reads to the device want pinned buffers
        size = size_class(nbytes)
        with self._cond:
            while True:
                kept = self._free.get(size)
                if kept:
                    buffer = kept.pop()
                    self.kept -= size
                    break
                if self.held + size > self.budget and self.kept:
                    self._drop_one()  # buffers of other sizes make room first
                    continue
                # no wait here: the read reserved its bytes before it took any buffer
                # (:meth:`reserve`), so a read holding one buffer never waits for another
                buffer = None
                break
            self.in_use += size
            self.peak = max(self.peak, self.held)
        if buffer is None:
            try:
                buffer = self._alloc(size)
            except BaseException:
                with self._cond:
                    self.in_use -= size
                    self._cond.notify_all()
                raise
            with self._cond:
                self.allocated += size
        view = buffer[:nbytes]
        with self._cond:
            self._lent[view.ctypes.data] = buffer
        return view

    def give(self, view: np.ndarray) -> None:
        with self._cond:
            if view.ctypes.data in self._from_arena:  # back to the store's arena, not kept
                self._from_arena.discard(view.ctypes.data)
                self.in_use -= int(view.nbytes)
                self.pinned.release(view)
                self._cond.notify_all()
                return
            buffer = self._lent.pop(view.ctypes.data)
            size = int(buffer.nbytes)
            self.in_use -= size
            if self.held + size <= self.budget:
                self._free.setdefault(size, []).append(buffer)
                self.kept += size
            self._cond.notify_all()

    def hold(self, nbytes: int) -> None:
        """Count ``nbytes`` held outside the set's buffers for a read in flight (the
        streaming zstd decoder's window, :mod:`.stream_decode`) as in use."""
        with self._cond:
            self.in_use += nbytes
            self.peak = max(self.peak, self.held)

    def unhold(self, nbytes: int) -> None:
        with self._cond:
            self.in_use -= nbytes
            self._cond.notify_all()

    def release_kept(self) -> int:
        """Give the kept buffers back to the system; returns their bytes."""
        with self._cond:
            freed = self.kept
            self._free.clear()
            self.kept = 0
            self._cond.notify_all()
        return freed

    def _drop_one(self) -> None:
        size = next(s for s, bufs in self._free.items() if bufs)
        self._free[size].pop()
        self.kept -= size

    def counts(self) -> dict:
        with self._cond:
            return {"budget": self.budget, "in_use": self.in_use, "kept": self.kept, "peak": self.peak,
                    "allocated": self.allocated, "arena_taken": self.arena_taken}


class HostDecoder:
    """The pool: ``threads`` threads that each read, decode and copy one chunk at a time,
    over one :class:`BufferSet`."""

    def __init__(self, threads: int, budget: int, pinned=None):
        from . import stream_decode

        self.threads = threads
        self.buffers = BufferSet(budget, pinned=pinned)
        #: chunks of one zstd frame go to the device decoded while read, in pieces
        #: (:mod:`.stream_decode`); without python-zstandard, whole (logged once)
        self.streams = stream_decode.available()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="spillway-zarr-decode")
        self._local = threading.local()
        self._idle: threading.Timer | None = None
        self._active = 0
        self._reading = 0
        #: the most chunk reads in flight at once (what the pool is for)
        self.most_reading = 0
        self._lock = threading.Lock()

    def submit(self, read: Callable, to_device: bool, need: int = 0) -> Future:
        """Run ``read(io)`` in the pool (``io`` a :class:`~.host_io.HostIO` over this
        pool's buffers, of which it takes at most ``need`` bytes); its chunk is copied to
        the device there when ``to_device``."""
        with self._lock:
            self._active += 1
            if self._idle is not None:
                self._idle.cancel()
                self._idle = None
        return self._pool.submit(self._run, read, to_device, need)

    def _run(self, read, to_device: bool, need: int):
        from .host_io import HostIO

        io = HostIO(self.buffers, device_sink=self._device_sink if to_device and self.streams else None)
        self.buffers.reserve(need)
        with self._lock:
            self._reading += 1
            self.most_reading = max(self.most_reading, self._reading)
        try:
            chunk = read(io)
            if not to_device:  # a copy: the buffers go back to the set below
                return np.array(chunk, copy=True)
            return chunk if io.on_device else self._copy(chunk)
        finally:
            io.give_back()
            self.buffers.unreserve(need)
            with self._lock:
                self._reading -= 1
                self._active -= 1
                if self._active == 0:
                    self._idle = threading.Timer(IDLE_RELEASE_S, self.buffers.release_kept)
                    self._idle.daemon = True
                    self._idle.start()

    def _copy(self, chunk):
        """The host chunk on the device, copied on this thread's own stream (a
        non-blocking one: on the legacy default stream the copy would wait for the
        compute kernels of the worker's task thread, and later kernels for the copy).

        The device buffer is allocated on the default stream, as the task thread's
        arrays are, and the copy waits for the work already queued there: RMM's pool
        hands out memory freed on that stream as soon as the free is queued, so a kernel
        still reading the previous chunk may own these bytes until it finishes."""
        import cupy

        stream = self._stream()
        start = time.perf_counter()
        host = np.ascontiguousarray(chunk)
        out = cupy.empty(host.shape, dtype=host.dtype)
        stream.wait_event(cupy.cuda.Stream.null.record())
        out.set(host, stream=stream)
        stream.synchronize()  # the host buffer goes back to the set after this
        count_stage("copy", int(host.nbytes), time.perf_counter() - start)
        return out

    def _stream(self):
        """This pool thread's own non-blocking stream (:meth:`_copy` says why)."""
        import cupy

        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = cupy.cuda.Stream(non_blocking=True)
        return stream

    def _device_sink(self, nbytes: int) -> DeviceSink:
        return DeviceSink(nbytes, self._stream())

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            if self._idle is not None:
                self._idle.cancel()
        self.buffers.release_kept()


class DeviceSink:
    """A chunk decoded piece by piece (:mod:`.stream_decode`) into one device buffer: each
    piece is copied from its staging buffer on the pool thread's stream as soon as it is
    decoded, and the decoder writes the next piece into the other staging buffer while it
    copies (it waits for the copy from a buffer before it writes that buffer again).
    Staging buffers from the store's pinned arena copy asynchronously; pageable ones at
    the pageable rate, the copy call returning once the driver has taken the bytes.

    As in :meth:`HostDecoder._copy`, the device buffer is allocated on the default
    stream and the copies wait for the work already queued there. The copy stage counts
    the thread's seconds issuing and waiting for copies (copies hidden behind the decode
    cost none)."""

    def __init__(self, nbytes: int, stream):
        import cupy

        start = time.perf_counter()
        self.nbytes = nbytes
        self.stream = stream
        self.out = cupy.empty(nbytes, dtype=cupy.uint8)
        stream.wait_event(cupy.cuda.Stream.null.record())
        self._copied = [None, None]  # per staging buffer: the event after its last copy
        self.seconds = time.perf_counter() - start

    def wait(self, slot: int) -> None:
        event = self._copied[slot]
        if event is not None:
            start = time.perf_counter()
            event.synchronize()
            self.seconds += time.perf_counter() - start

    def put(self, slot: int, offset: int, piece) -> None:
        start = time.perf_counter()
        host = np.frombuffer(piece, dtype=np.uint8)
        self.out[offset:offset + host.nbytes].set(host, stream=self.stream)
        self._copied[slot] = self.stream.record()
        self.seconds += time.perf_counter() - start

    def finish(self):
        start = time.perf_counter()
        self.stream.synchronize()  # the staging buffers go back to the set after this
        self.seconds += time.perf_counter() - start
        count_stage("copy", self.nbytes, self.seconds)
        return self.out

    def abandon(self) -> None:
        self.stream.synchronize()


_decoder: HostDecoder | None = None
_decoder_lock = threading.Lock()


def decoder() -> HostDecoder:
    """This process's pool, made on first use."""
    global _decoder
    with _decoder_lock:
        if _decoder is None:
            _decoder = HostDecoder(_threads(), _budget(), _store_host_buffers())
            from spillway.launch.plugins import on_teardown

            on_teardown(close)  # the worker's teardown stops the pool while CUDA is alive
        return _decoder


def _store_host_buffers():
    """The tiered store's host buffers on a worker that has one, else None."""
    try:
        from distributed import get_worker

        data = get_worker().data
    except (ImportError, ValueError):
        return None
    from spillway.memory.store import TieredStore

    return data.host if isinstance(data, TieredStore) else None


def close() -> None:
    """Stop this process's pool and give back its buffers (the worker's teardown)."""
    global _decoder
    from . import stream_decode

    with _decoder_lock:
        pool, _decoder = _decoder, None
    if pool is not None:
        pool.close()
    stream_decode.close()


def buffer_counts() -> dict:
    """The decode buffers' bytes in this process (budget, in use, kept for reuse, peak,
    allocated, taken from the store's arena), the pool's threads and the most chunk reads
    it had in flight at once."""
    pool = _decoder
    if pool is None:
        return {"budget": 0, "in_use": 0, "kept": 0, "peak": 0, "allocated": 0, "arena_taken": 0, "threads": 0,
                "reads_in_flight_peak": 0}
    return {**pool.buffers.counts(), "threads": pool.threads, "reads_in_flight_peak": pool.most_reading}


def bytes_to_read(files, coords, to_device: bool = False) -> int:
    """The host bytes a chunk's read takes: its file and its decoded chunk; for a chunk of
    one zstd frame going to the device where the pool streams it, its file piece, its two
    staging pieces and the decoder's window, which the frame's header states
    (:func:`.stream_decode.need`)."""
    from .chunk_files import ZSTD
    from .stream_decode import need, window_of

    from .pinned import fd_path

    try:
        fd = files.open_chunk(coords)
    except (OSError, ValueError):
        fd = None  # the read itself says why
    if fd is None:
        return files.chunk_bytes
    try:
        size = os.fstat(fd).st_size
        if size and to_device and files.encoding == ZSTD and decoder().streams:
            window = window_of(fd_path(fd))
            if window is not None:
                return need(size, files.chunk_bytes, window)
    finally:
        os.close(fd)
    return size + files.chunk_bytes


def read_in_pool(read: Callable, *, need: int = 0, to_device: bool = True):
    """``read(io)`` run in this process's pool, taking at most ``need`` bytes of host
    buffers, the chunk on the device (or a NumPy copy with ``to_device=False``); on a
    dask worker the calling task secedes while it waits, so the worker starts its next
    tasks (the module docstring says why)."""
    future = decoder().submit(read, to_device, need)
    worker = _in_worker()
    if not worker:
        return future.result()
    from distributed import rejoin, secede

    secede()
    try:
        return future.result()
    finally:
        rejoin()


def _in_worker() -> bool:
    """Whether this thread runs a task in a dask worker's thread pool (and may secede)."""
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):
        return False
    from spillway import upstream

    return upstream.in_task_thread()
