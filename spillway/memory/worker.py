"""The tiered store inside a GPU worker: built by the worker (:func:`gpu_worker_store`,
through :func:`spillway.launch.worker_store.build_store`) and wired to the
worker's task queue, RMM resource and event loop by the worker plugin."""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable

import numpy as np

from .. import upstream
from .books import HostBooks
from .codecs import CupyCodec
from .disk import DiskTier
from .growth import TOUCH_STEP, headroom_for, host_available, host_total
from .host import TOUCH_FROM, HostBuffers
from .store import TieredStore


#: cudaHostRegisterPortable: pinned for every CUDA context of the process
_REGISTER_PORTABLE = 1
#: bytes touched per call, each with the GIL released (ctypes.memset), the growth's step
_TOUCH_STEP = TOUCH_STEP
#: threads touching one segment: the first touch is page faults (the kernel zeroing and
#: mapping each page, and on a virtual machine the host backing it), which one thread
#: does at 1.1-1.6 GiB/s on the GPU hosts and eight at 4.9-11 GiB/s
#: (benchmarks/results/*-first-touch.txt: 2 MiB pages 3.05 GiB/s with four, 4.90 with
#: eight); they run at the growth thread's nice value, and wait for a quiet worker unless
#: a spill wants the arena. Half the cores, at most eight: the one-GPU hosts' 16 cores
#: gave four, and their arena (63 GiB) took about 20 s to touch, longer than the first
#: out-of-core run it should be ready for
_TOUCH_THREADS = max(1, min(8, (os.cpu_count() or 2) // 2))


def take_segment(nbytes: int) -> np.ndarray:
    """One arena segment: host memory touched page by page (:func:`touch_segment`), then
    pinned (:func:`pin_segment`)."""
    return pin_segment(touch_segment(nbytes))


def touch_segment(nbytes: int, between: Callable[[], None] | None = None) -> np.ndarray:
    """Host memory for one arena segment, page aligned, touched page by page; not pinned.

    The two costs are taken apart on purpose. Touching (the host handing its RAM to the
    machine) runs as plain memsets that release the GIL and involve no CUDA call; pinning
    the pages already there (cudaHostRegister, :func:`pin_segment`) is then shorter, and
    the growth does it when the worker is quiet or a spill waits. Pinning is one of the
    calls that hold the driver's locks against every CUDA call, so a cudaHostAlloc that
    also touched gigabytes would hold spills and kernels of the running worker for seconds.

    A fresh host's first spills wait for the arena, so it is taken as fast as the host
    hands memory out: a few threads touch it, in 2 MiB pages where the kernel's
    transparent huge pages allow them (asked for with madvise). Touched and pinned, they
    come faster: pinning them ran at 26 against 6.6 GiB/s for 4 KiB pages on the H100 host
    and 18.3 against 2.7 on the 2 x H200 host, where touching them was slower (4.9 against
    8.5 GiB/s, eight threads) and the two together still gained (3.6 GiB/s a segment
    against about 2 for 4 KiB pages). Segments are kept for
    the worker's life (see :func:`give_back_segment` for one that is not used).
    ``between()``, where given, is called before each step is touched (the growth waits
    there for a quiet worker, and raises to stop)."""
    import ctypes
    import mmap

    # an anonymous mapping of its own: page aligned, and its pages go back to the host
    # whole once the segment is dropped (a heap block may not)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError, AttributeError):
        pass  # no transparent huge pages here: 4 KiB pages, slower to take
    buf = np.frombuffer(region, dtype=np.uint8)
    ptr = buf.ctypes.data
    steps = [(ptr + start, min(_TOUCH_STEP, nbytes - start)) for start in range(0, nbytes, _TOUCH_STEP)]
    def touch(step):
        if between is not None:
            between()
        ctypes.memset(step[0], 0, step[1])

    if _TOUCH_THREADS > 1 and len(steps) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(_TOUCH_THREADS, len(steps)), thread_name_prefix="spillway-touch") as pool:
            list(pool.map(touch, steps))  # the first step's exception is raised here
    else:
        for step in steps:
            touch(step)
    return buf


def pin_segment(buf: np.ndarray) -> np.ndarray:
    """Page-lock a segment made by :func:`touch_segment` (its pages are there already, so
    this is the pinning alone; it holds the driver's locks while it runs: see
    :mod:`spillway.memory.growth`)."""
    import cupy

    cupy.cuda.runtime.hostRegister(buf.ctypes.data, buf.nbytes, _REGISTER_PORTABLE)
    return buf


def give_back_segment(buf: np.ndarray) -> None:
    """Unpin a segment taken by :func:`take_segment` that the arena will not use."""
    import cupy

    cupy.cuda.runtime.hostUnregister(buf.ctypes.data)


def gpu_worker_store(
    *,
    worker_local_directory: str,
    device_memory_limit: int | None,
    host_limit: int | None,
    pinned_pool_size: int,
    pinned_limit: int | None = None,
    memory_limit: int | None = None,
) -> TieredStore:
    """Runs in the worker process (its CUDA_VISIBLE_DEVICES already set). The limits are
    bytes, None for none (the worker's spec resolved them:
    :mod:`spillway.launch.spec`); ``memory_limit`` bounds what the whole process
    holds, measured, beside the host tier's books."""
    # past the arena, pinned buffers from CuPy's pool (freed ones are reused) up to the
    # worker's share of what the host may pin, then pageable ones, touched by several
    # threads and kept for reuse up to the host tier's limit
    host = HostBuffers(None, _pinned_fallback, pinned_limit=pinned_limit, trim=_trim_pinned_pool,
                       pageable=touched_pageable, pageable_cache=host_limit or 0,
                       touch_ahead=min(TOUCH_AHEAD_BYTES, (host_limit or 0) // 8))
    store = TieredStore(
        device_limit=device_memory_limit,
        host_limit=host_limit,
        codec=CupyCodec(),
        below=[DiskTier(worker_local_directory)],
        host=host,
        books=HostBooks(host_available, headroom=headroom_for(host_total()), process_limit=memory_limit),
        drain=True,
    )
    if pinned_pool_size:
        store.on_start.append(functools.partial(start_arena, host, int(pinned_pool_size)))
    return store


#: seconds after its arena starts growing that a worker counts as busy to the growth while
#: its cluster is starting (:func:`cluster_ready` ends it sooner): touching and pinning
#: gigabytes slowed the start's own steps. Two H200s, four workers, under py-spy: the
#: workers' touching threads were their busiest stacks while the client waited 12.4 s for a
#: 4 MiB value from each (1.9-4.1 s without the profiler); a worker that joins a running
#: cluster grows after this long, or at once when a spill wants the arena
START_HOLD_S = 60.0


class StartHold:
    """A worker's arena waits while its cluster starts: until :data:`START_HOLD_S` after
    the growth began, or until the launcher says the cluster is ready (:func:`cluster_ready`),
    whichever comes first. Kept on the worker's host buffers (``host.start_hold``)."""

    def __init__(self, seconds: float = START_HOLD_S):
        self.until = time.monotonic() + seconds
        self.ready = threading.Event()

    def holds(self) -> bool:
        return not self.ready.is_set() and time.monotonic() < self.until


def cluster_ready(dask_worker=None) -> None:
    """The cluster ``dask_worker`` belongs to is ready (its launcher says so, once its
    start's steps are done): its arena grows from now on."""
    hold = getattr(getattr(getattr(dask_worker, "data", None), "host", None), "start_hold", None)
    if hold is not None:
        hold.ready.set()


def start_arena(host: HostBuffers, nbytes: int):
    """Grow the pinned arena to ``nbytes`` on a background thread (see
    :mod:`spillway.memory.growth`): the worker starts at once, and its spills use each
    segment as soon as it is in. Taking it here, before the worker opens its comms, took
    about 35 s for 80 GB on the GPU host and held the worker's start as long."""
    hold = host.start_hold = StartHold()
    return host.grow_arena(
        nbytes, touch_segment,
        pin=pin_segment,
        busy=functools.partial(_worker_busy, hold),
        give_back=give_back_segment,
        trim=_trim_pinned_pool,
        prepare=_near_the_gpu,
        should_stop=_worker_closing,
        available=host_available,
        headroom=headroom_for(host_total()),
    )


#: bytes of pageable buffers a worker keeps touched ahead of its spills, at most (an eighth
#: of its host tier where smaller): about half a second of the first touch's rate on the
#: one-H100 host, so that spills at the pinned copy's rate seldom catch up with it
TOUCH_AHEAD_BYTES = 8 * 2**30


def touched_pageable(nbytes: int) -> np.ndarray:
    """A pageable host buffer whose pages are there before a copy writes it: the copy
    from the device into untouched pages pays each page's first touch on the one thread
    that copies (1.6 GiB/s on the 2 x H200 host), where :func:`touch_segment`'s threads
    take them at 4.9-8.5 GiB/s. Small buffers are plain ``numpy.empty``."""
    if nbytes < TOUCH_FROM:
        return np.empty(nbytes, dtype=np.uint8)
    return touch_segment(nbytes)


def _pinned_fallback(nbytes: int) -> np.ndarray:
    import cupyx

    return cupyx.empty_pinned(nbytes, dtype=np.uint8)


def _trim_pinned_pool() -> None:
    """Free the pinned blocks CuPy's pool keeps after on-demand buffers are released: they
    are still pinned, but the limit counts only buffers in use."""
    import cupy

    cupy.get_default_pinned_memory_pool().free_all_blocks()


def _near_the_gpu() -> None:
    """Run the growing thread on the cores next to this worker's GPU, so the arena's pages
    land on the GPU's NUMA node. dask-cuda pins the worker's own threads there, but only
    when its plugins run, after the store (and this thread) exist."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        cores = upstream.gpu_cores(visible)
        if cores:
            os.sched_setaffinity(0, cores)


def _worker_busy(hold: StartHold | None = None) -> bool:
    """Whether a worker of this process is running a task or moving data: a pin now would
    hold its CUDA calls (read from the growth thread: a counter read a moment stale only
    moves a pin by one look); and while its cluster is starting (``hold``)."""
    workers = upstream.workers_of_process()
    if workers and hold is not None and hold.holds():
        return True
    return any(upstream.at_work(w) for w in workers)


def _worker_closing() -> bool:
    """Whether the worker of this process is closing (the store has no close hook of its
    own in distributed): growth stops instead of pinning memory on the way out."""
    try:
        from distributed.core import Status
    except ImportError:
        return False
    workers = upstream.workers_of_process()
    done = {Status.closing, Status.closed, Status.closing_gracefully, Status.failed}
    return bool(workers) and all(w.status in done for w in workers)
