"""Growing a worker's pinned arena on a background thread, segment by segment.

On the GPU host, pinned memory took 2.2 to 2.5 GiB/s to allocate and touch (the host's RAM
is handed to the machine as it is first touched): 80 GB took about 35 s. Taken while the
worker is built, that delays its start by as much; taken on demand by the first spills, it
made them run at 1.3-1.5 GB/s. So one thread, at the lowest CPU priority, takes the arena
in segments from the moment the worker is built, and each segment serves spills as soon as
it is in; until then, spills take :class:`~spillway.memory.host.HostBuffers`' on-demand path.

Pinning is taken apart from touching, and waits for a quiet device. Page-locking host
memory (cudaHostRegister, as cudaHostAlloc) holds locks of the NVIDIA driver that the CUDA
calls of the process, and of the node's other processes, wait on for as long as it runs
(reported at about 0.1 s a GB on H200 hosts; the bench and the ten-run probe time each pin
beside each run here), so pinning a 4 GiB segment while a worker computes would hold its
kernels, copies and transfers, and its neighbours', for a few tenths of a second: the
size of the stalls the bench's timed runs showed. So a touched segment is pinned
only once the worker has had no task and no transfer for :data:`QUIET_S`, or at once when
the host tier wants room the arena does not have yet (the first spill that misses it: the
work is then waiting on host memory anyway).

Touching yields to work the same way, between steps of :data:`TOUCH_STEP` bytes. It needs
no CUDA call, but on the H200 host a fresh cluster's ten-run probe (`(x + x.T).sum()` on a
persisted array) took 1.1-2.4 s for its first run and 0.54-0.75 s for its second while
both workers touched their arenas, against 0.76 s and 0.05 s with no arena (dask-cuda:
1.06 s and 0.06 s): the time went to the scheduler's way to the first task and the result's
way back to the client, not to the tasks (``benchmarks/results/2x-nvidia-h200-2026-11-27T20*-s12-probe-*``, 2026-11-27).
Page faults by the gigabyte on a virtual machine are what slowed them down.

The thread never makes the worker die for memory: each segment is reserved against the
worker's pinned limit before it is taken (beside on-demand buffers), it waits while the
host has less than a headroom of memory available beyond the segment, and a failed pin
stops the growth (logged once), keeping the segments already taken.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .arena import ALIGN

logger = logging.getLogger("spillway.memory")

GiB = 1 << 30
#: Segment size. A value never spans two segments (two pinned allocations need not be
#: adjacent), so a segment wastes at most one value's worth at its end, and a value larger
#: than a segment takes the on-demand path. 4 GiB holds five of the 800 MB chunks of the
#: bench's transpose-sum (93% used) and 32 of dask's default 128 MiB array chunks, and is
#: taken in under 2 s at the GPU host's first-touch rate, so the first segment is in before
#: a new cluster has run anything. Larger values make later segments larger (below).
SEGMENT_BYTES = 4 * GiB
#: later segments hold at least this many of the largest value asked for so far, so the
#: space lost at a segment's end stays under a quarter of it
VALUES_PER_SEGMENT = 4
#: but no segment larger than this (about 7 s to take at the GPU host's rate)
MAX_SEGMENT_BYTES = 16 * GiB
#: nice value of the growing thread: it yields the CPU to the worker's own threads
NICE = 19
#: seconds without a task or a transfer on the worker before a segment is pinned (while
#: no spill is waiting for the arena): longer than the gaps between the tasks of a graph
#: and between the graphs a client sends in a row, so pins land where no one waits
QUIET_S = 1.0
#: seconds between two looks at whether the worker is at work, while a pin waits
BUSY_POLL_S = 0.02
#: bytes a touching thread touches between two looks at whether the worker is at work
#: (about 0.1 s of a thread's first-touch rate on the GPU host)
TOUCH_STEP = 256 << 20
#: pins a growth keeps the times of (the latest), for :meth:`ArenaGrowth.summary`
PINS_KEPT = 64


class GrowthClosed(Exception):
    """The growth was stopped while a segment was being touched."""


class ArenaGrowth(threading.Thread):
    """Takes ``target`` bytes of pinned memory for ``host``'s arena, one segment at a time.

    ``take(nbytes)`` returns a 1-D uint8 buffer of touched memory, pinned unless ``pin``
    is given: then ``pin(buffer)`` pins it, once the worker is quiet (``busy()`` false
    for :data:`QUIET_S`) or the host tier wants room (``host.wanted``), and where ``busy``
    is given too ``take(nbytes, between)`` calls ``between()`` before each step it
    touches: it returns once the worker is quiet or the host tier wants room (it raises
    :class:`GrowthClosed` where the growth is stopped meanwhile).
    ``give_back(buffer)`` unpins one taken while the growth was being stopped. Optional:
    ``trim()`` gives back pinned memory cached by the on-demand allocator before a segment
    is reserved (cached blocks are pinned too but not counted as in use); ``prepare()``
    runs first on the thread (CPU affinity near the GPU, so pages land on its NUMA node);
    ``should_stop()`` says the worker is closing; ``available()`` is the host memory
    available now, and growth waits while fewer than ``headroom`` bytes would remain after
    the next segment."""

    def __init__(
        self,
        host,
        target: int,
        take: Callable[[int], np.ndarray],
        *,
        give_back: Callable[[np.ndarray], None] | None = None,
        segment_bytes: int = SEGMENT_BYTES,
        max_segment_bytes: int = MAX_SEGMENT_BYTES,
        trim: Callable[[], None] | None = None,
        prepare: Callable[[], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        available: Callable[[], int] | None = None,
        headroom: int = 0,
        retry_s: float = 1.0,
        pin: Callable[[np.ndarray], None] | None = None,
        busy: Callable[[], bool] | None = None,
        quiet_s: float = QUIET_S,
    ):
        super().__init__(name="spillway-pinned-arena", daemon=True)
        self.host = host
        self.target = int(target if host.pinned_limit is None else min(target, host.pinned_limit))
        self.take = take
        self.give_back = give_back
        self.segment_bytes = int(segment_bytes)
        self.max_segment_bytes = max(int(max_segment_bytes), self.segment_bytes)
        self.trim = trim
        self.prepare = prepare
        self.should_stop = should_stop
        self.available = available
        self.headroom = int(headroom)
        self.retry_s = retry_s
        self.pin = pin
        self.busy = busy
        self.quiet_s = float(quiet_s)
        #: bytes this thread added to the arena
        self.taken = 0
        #: "growing", "waiting for host memory", "waiting for the pinned limit", "ready",
        #: "stopped: <why>"
        self.state = "growing"
        self.started_at = time.time()
        self._t0 = time.monotonic()
        self.first_segment_s: float | None = None
        self.ready_s: float | None = None
        #: seconds spent inside ``take`` (the cost of pinning and first touch)
        self.take_s = 0.0
        #: seconds spent inside ``pin`` (where given), and waiting for a quiet worker
        self.pin_s = 0.0
        self.quiet_wait_s = 0.0
        #: seconds the touching threads waited for a quiet worker (summed over threads)
        self.touch_wait_s = 0.0
        self._lock = threading.Lock()
        #: the latest pins, wall-clock start and stop and bytes: what a run beside them waited on
        self.pins: collections.deque = collections.deque(maxlen=PINS_KEPT)
        #: segments touched and reserved, waiting to be pinned (oldest first)
        self._touched: collections.deque = collections.deque()
        self._quiet_since = time.monotonic()
        self._closing = threading.Event()
        self._said: set[str] = set()

    # --- control

    def stop(self, timeout: float | None = 10.0) -> None:
        self._closing.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)

    @property
    def ready(self) -> bool:
        return self.ready_s is not None

    def summary(self) -> dict:
        return {
            "arena_target_bytes": self.target,
            "arena_state": self.state,
            "arena_started_at": self.started_at,
            "arena_first_segment_s": self.first_segment_s,
            "arena_ready_s": self.ready_s,
            "arena_ready_at": None if self.ready_s is None else self.started_at + self.ready_s,
            "arena_take_s": self.take_s,
            "arena_pin_s": self.pin_s,
            "arena_quiet_wait_s": self.quiet_wait_s,
            "arena_touch_wait_s": self.touch_wait_s,
            "arena_pins": list(self.pins),
        }

    # --- the thread

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # never let the growth take the worker down
            self.state = f"stopped: {type(e).__name__}: {e}"
            logger.exception("pinned arena growth failed; keeping %d bytes", self.taken)

    def _run(self) -> None:
        _lower_priority()
        if self.prepare is not None:
            try:
                self.prepare()
            except Exception:
                logger.debug("pinned arena: prepare failed", exc_info=True)
        try:
            self._grow()
        finally:
            # touched segments never pinned hold only their reservation
            while self._touched:
                _, size = self._touched.popleft()
                self.host.cancel_segment(size)

    def _grow(self) -> None:
        while True:
            if self._closing.is_set():
                self._stopped("closed")
                return
            if self.should_stop is not None and self.should_stop():
                self._stopped("worker closing")
                return
            if self._touched and self._may_pin():
                if not self._pin_oldest():
                    return
                continue
            remaining = self.target - self.taken - sum(size for _, size in self._touched)
            if remaining <= 0:
                if self._touched:  # all touched: the rest waits for a quiet worker
                    self._look_for_quiet()
                    continue
                self._ready()
                return
            size = self._next_size(remaining)
            if self.available is not None and self.available() - size < self.headroom:
                self._wait("waiting for host memory",
                           "pinned arena: waiting for host memory (%d bytes available, keeping %d "
                           "free beside the next %d-byte segment)", self.available(), self.headroom, size)
                continue
            if self.trim is not None:
                try:
                    self.trim()
                except Exception:
                    logger.debug("pinned arena: trimming the on-demand pool failed", exc_info=True)
            if not self.host.reserve_segment(size):
                self._wait("waiting for the pinned limit",
                           "pinned arena: buffers pinned on demand hold the rest of the pinned limit "
                           "(%d bytes); growing again as they are released", self.host.pinned_limit)
                continue
            self.state = "growing"
            start = time.monotonic()
            try:
                buffer = self.take(size, self._yield_to_work) if self._yields else self.take(size)
            except GrowthClosed:
                self.host.cancel_segment(size)
                self._stopped("closed")
                return
            except Exception as e:
                self.host.cancel_segment(size)
                self._failed(size, e)
                return
            self.take_s += time.monotonic() - start
            if self.pin is not None:
                # touched, not pinned: it waits for a quiet worker (what the worker did
                # while this thread touched is not known: the quiet spell starts now)
                self._touched.append((buffer, size))
                self._quiet_since = time.monotonic()
                continue
            if not self._add(buffer, size):
                return

    def _add(self, buffer: np.ndarray, size: int) -> bool:
        """Hand a pinned segment to the arena; False where the growth was closed while it
        was taken (it is given back, not used)."""
        if self._closing.is_set():
            self.host.cancel_segment(size)
            if self.give_back is not None:
                try:
                    self.give_back(buffer)
                except Exception:
                    logger.debug("pinned arena: giving back a segment failed", exc_info=True)
            del buffer
            self._stopped("closed")
            return False
        self.host.add_segment(buffer, size)
        self.taken += size
        if self.first_segment_s is None:
            self.first_segment_s = time.monotonic() - self._t0
        return True

    def _failed(self, size: int, e: Exception) -> None:
        self._stopped(f"pinning {size} bytes failed: {type(e).__name__}: {e}")
        logger.warning("pinned arena: could not pin %d more bytes (%s: %s); keeping the %d bytes "
                       "taken, past them spills use buffers pinned on demand",
                       size, type(e).__name__, e, self.taken)

    # --- touches and pins: when the worker is quiet, or the host tier wants the arena

    @property
    def _yields(self) -> bool:
        return self.pin is not None and self.busy is not None

    def _yield_to_work(self) -> None:
        """Called by the touching threads before each step: return once the worker is
        quiet or the host tier wants room; raise :class:`GrowthClosed` once stopped."""
        waited = None
        while not self._may_pin():
            if self._closing.is_set() or (self.should_stop is not None and self.should_stop()):
                raise GrowthClosed
            if waited is None:
                waited = time.monotonic()
                self.state = "touching: waiting for a quiet worker"
            self.host.wanted.wait(BUSY_POLL_S)
        if self._closing.is_set():
            raise GrowthClosed
        if waited is not None:
            with self._lock:
                self.touch_wait_s += time.monotonic() - waited
            self.state = "growing"

    def _may_pin(self) -> bool:
        if self.busy is None or self.host.wanted.is_set():
            return True
        now = time.monotonic()
        try:
            at_work = self.busy()
        except Exception:  # noqa: BLE001 (a worker that cannot say is taken as quiet)
            at_work = False
        if at_work:
            self._quiet_since = now
            return False
        return now - self._quiet_since >= self.quiet_s

    def _look_for_quiet(self) -> None:
        """Wait one look (:data:`BUSY_POLL_S`), woken early by the host tier wanting room."""
        self.state = "waiting for a quiet worker"
        began = time.monotonic()
        self.host.wanted.wait(BUSY_POLL_S)
        self.quiet_wait_s += time.monotonic() - began

    def _pin_oldest(self) -> bool:
        """Pin the segment touched first and hand it to the arena; False where the growth
        stops (the pin failed, or it was closed meanwhile)."""
        buffer, size = self._touched.popleft()
        self.state = "growing"
        started, start = time.time(), time.monotonic()
        try:
            self.pin(buffer)
        except Exception as e:
            self.host.cancel_segment(size)
            self._failed(size, e)
            return False
        took = time.monotonic() - start
        self.pin_s += took
        self.pins.append({"start": started, "stop": started + took, "bytes": int(size)})
        return self._add(buffer, size)

    def _next_size(self, remaining: int) -> int:
        size = max(self.segment_bytes, VALUES_PER_SEGMENT * self.host.largest_request)
        size = min(size, self.max_segment_bytes)
        size = -(-size // ALIGN) * ALIGN
        return min(size, remaining)

    def _ready(self) -> None:
        self.ready_s = time.monotonic() - self._t0
        self.state = "ready"
        logger.info("pinned arena ready: %d bytes in %d segments, %.1f s after the worker was built "
                    "(%.1f s pinning)", self.taken, self.host.arena.segments if self.host.arena else 0,
                    self.ready_s, self.take_s)

    def _stopped(self, why: str) -> None:
        self.state = f"stopped: {why}"

    def _wait(self, state: str, message: str, *args) -> None:
        if self._touched:
            # segments wait to be pinned: look for a quiet worker instead of sleeping
            self._look_for_quiet()
            return
        self.state = state
        if state not in self._said:
            self._said.add(state)
            logger.info(message, *args)
        self._closing.wait(self.retry_s)


def _lower_priority() -> None:
    """Lowest CPU priority for the calling thread (Linux sets nice values per thread)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    except (AttributeError, OSError):
        pass


# --- host memory, as the kernel's out-of-memory killer sees it


def host_available() -> int:
    """Bytes of memory available to this process now: the machine's, and within its
    cgroup's limit where it has one (containers see the whole machine in /proc/meminfo)."""
    import psutil

    available = int(psutil.virtual_memory().available)
    limit, usage = _cgroup_memory()
    if limit is not None and usage is not None:
        available = min(available, max(0, limit - usage))
    return available


def host_total() -> int:
    """The memory this host's workers may use: the machine's, or its container's limit
    (cgroup) where lower, as the out-of-memory killer counts it."""
    import psutil

    total = int(psutil.virtual_memory().total)
    limit, _ = _cgroup_memory()
    return min(total, limit) if limit is not None else total


def headroom_for(total: int) -> int:
    """Host memory the growth leaves free: a tenth of it, at least 2 GiB."""
    return max(2 * GiB, total // 10)


def _cgroup_memory() -> tuple[int | None, int | None]:
    """This process's cgroup memory limit (None: none) and usage less the page cache the
    kernel can drop (as container runtimes count a working set)."""
    for base, limit_name, usage_name, inactive_name in (
            ("/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"),
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")):
        try:
            limit = Path(base, limit_name).read_text().strip()
            usage = int(Path(base, usage_name).read_text().strip())
        except (OSError, ValueError):
            continue
        usage -= _stat(Path(base, "memory.stat"), inactive_name)
        if not limit.isdigit() or int(limit) >= 1 << 60:  # "max", or v1's "no limit"
            return None, usage
        return int(limit), usage
    return None, None


def _stat(path: Path, name: str) -> int:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0
