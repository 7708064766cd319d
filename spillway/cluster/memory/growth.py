"""Growing a worker's pinned arena on a background thread, segment by segment.

On the GPU host, pinned memory took 2.2 to 2.5 GiB/s to allocate and touch (the host's RAM
is handed to the machine as it is first touched): 80 GB took about 35 s. Taken while the
worker is built, that delays its start by as much; taken on demand by the first spills, it
made them run at 1.3-1.5 GB/s. So one thread, at the lowest CPU priority, takes the arena
in segments from the moment the worker is built, and each segment serves spills as soon as
it is in; until then, spills take :class:`~spillway.cluster.memory.host.HostBuffers`' on-demand path.

The thread never makes the worker die for memory: each segment is reserved against the
worker's pinned limit before it is taken (beside on-demand buffers), it waits while the
host has less than a headroom of memory available beyond the segment, and a failed pin
stops the growth (logged once), keeping the segments already taken.
"""

from __future__ import annotations

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


class ArenaGrowth(threading.Thread):
    """Takes ``target`` bytes of pinned memory for ``host``'s arena, one segment at a time.

    ``take(nbytes)`` returns a 1-D uint8 buffer of pinned (and touched) memory, and
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
        while True:
            if self._closing.is_set():
                self._stopped("closed")
                return
            if self.should_stop is not None and self.should_stop():
                self._stopped("worker closing")
                return
            remaining = self.target - self.taken
            if remaining <= 0:
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
                buffer = self.take(size)
            except Exception as e:
                self.host.cancel_segment(size)
                self._stopped(f"pinning {size} bytes failed: {type(e).__name__}: {e}")
                logger.warning("pinned arena: could not pin %d more bytes (%s: %s); keeping the %d bytes "
                               "taken, past them spills use buffers pinned on demand",
                               size, type(e).__name__, e, self.taken)
                return
            self.take_s += time.monotonic() - start
            if self._closing.is_set():
                # closed while this segment was being taken: it is not used
                self.host.cancel_segment(size)
                if self.give_back is not None:
                    try:
                        self.give_back(buffer)
                    except Exception:
                        logger.debug("pinned arena: giving back a segment failed", exc_info=True)
                del buffer
                self._stopped("closed")
                return
            self.host.add_segment(buffer, size)
            self.taken += size
            if self.first_segment_s is None:
                self.first_segment_s = time.monotonic() - self._t0

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
