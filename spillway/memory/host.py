"""The host tier: spilled segments in host buffers, and the buffers themselves (the pinned
arena first, then pinned buffers taken on demand within the worker's pinned limit, then
pageable buffers)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from .arena import Arena
from .codecs import Alloc, HostCopy
from .stats import MoveRates

logger = logging.getLogger("spillway.memory")

#: where a host buffer comes from (:attr:`HostBuffers.taken_from`)
SOURCES = ("arena", "kept", "pinned", "pageable")
#: pageable buffers from this size up are touched page by page when taken (smaller ones
#: cost little to take on the copy's own thread), and kept touched ahead of the spills
#: (:meth:`HostBuffers.touch_ahead`)
TOUCH_FROM = 64 * 2**20
#: touched pageable buffers kept ready ahead of the spills: at most this many of one size
AHEAD_VALUES = 32


class HostBuffers:
    """Host buffers for spilled values: slices of the pinned arena while it has room; past
    it, pinned buffers taken on demand while the arena and those together stay within
    ``pinned_limit`` bytes; past that, pageable buffers. Pageable copies are slower, but
    page-locked memory cannot be swapped or reclaimed, and workers that pin more than
    their share of the host are what the kernel's out-of-memory killer ends.

    The arena may grow while the worker runs (:meth:`grow_arena`): its segments are taken
    on a background thread, and until they are, values take the on-demand path. Segments
    being taken count against ``pinned_limit`` from the moment they are reserved, so the
    arena, the segments in flight and the on-demand buffers never pass it together.

    Every buffer that takes new memory from the machine (on-demand pinned or pageable,
    not an arena slice) is first announced to ``before_new(nbytes)``: the tiered store
    gives host memory back there (values to disk) until the machine and the process have
    room for it (:mod:`spillway.memory.books`). ``trim()`` gives back pinned
    blocks cached by the on-demand allocator.

    Pageable buffers given back are kept for reuse by size, kept and in use together up
    to ``pageable_cache`` bytes: a run past device and pinned memory spills buffers of the same few sizes over
    and over, and a buffer taken new costs the host's first touch of its pages (1.6 GiB/s
    on one thread of the 2 x H200 host) where one reused costs nothing. On two H200s an
    FFT at 1.5x their memory gave back and took anew about 100 GB of host memory in every
    run. Kept buffers count as held; :meth:`give_back` drops them (the store calls it
    before it writes to disk for room) and :meth:`expire` drops those unused for a while.

    With ``touch_ahead`` bytes, pageable buffers are also touched before a spill asks for
    them, on a thread of their own, once the pinned memory is all but taken
    (:meth:`touch_ahead`): on a fresh one-H100 host the first out-of-core FFT took 51 GB
    of new pageable buffers and its spills spent 3.5 s touching them, on the path of the
    task that spilled, where later runs reused kept ones."""

    def __init__(
        self,
        arena: Arena | None = None,
        pinned: Callable[[int], np.ndarray] | None = None,
        *,
        pinned_limit: int | None = None,
        pageable: Callable[[int], np.ndarray] | None = None,
        trim: Callable[[], None] | None = None,
        pageable_cache: int = 0,
        touch_ahead: int = 0,
    ):
        self.arena = arena
        self.pinned = pinned
        self.pinned_limit = pinned_limit
        self.pageable = pageable or (lambda n: np.empty(n, dtype=np.uint8))
        #: bytes of on-demand pinned buffers handed out and not yet released
        self.pinned_bytes = 0
        #: bytes handed out as pageable buffers since the start (past the pinned limit)
        self.pageable_total = 0
        #: bytes of pageable buffers handed out and not yet released
        self.pageable_bytes = 0
        #: called with the bytes of each buffer about to take new memory (see above)
        self.before_new: Callable[[int], None] | None = None
        self.trim = trim
        #: the largest buffer asked for so far (the arena's growth sizes segments from it)
        self.largest_request = 0
        #: the background thread growing the arena, if any
        self.growth = None
        #: while the worker's cluster starts, the growth waits (a GPU worker's
        #: :class:`~spillway.memory.worker.StartHold`; None: no hold)
        self.start_hold = None
        #: set by the first buffer the arena could not give: from then on the growth pins
        #: its segments without waiting for a quiet worker (the host tier is in use)
        self.wanted = threading.Event()
        self._arena_reserved = 0  # segments being taken, not yet in the arena
        self._on_demand: dict[int, int] = {}
        self._pageable: dict[int, int] = {}
        #: bytes of given-back pageable buffers kept for reuse, at most
        self.pageable_cache = int(pageable_cache or 0)
        #: bytes handed out since the start by where they came from: arena slices, kept
        #: pageable buffers, buffers pinned on demand, new pageable buffers (a spill's rate
        #: is the pinned link's only in the first)
        self.taken_from = dict.fromkeys(SOURCES, 0)
        #: seconds :meth:`alloc` spent in ``before_new`` (values written to disk for room)
        #: and taking new buffers (pinning, first touch of pageable pages)
        self.room_s = 0.0
        self.new_s = 0.0
        #: nbytes -> [(when given back, buffer)], the oldest first
        self._kept: dict[int, list] = {}
        #: bytes of the buffers in :attr:`_kept`
        self.kept_bytes = 0
        self._lock = threading.Lock()
        #: bytes of pageable buffers kept touched ahead of the spills, at most (0: none)
        self.ahead_limit = int(touch_ahead or 0)
        #: whether ``nbytes`` more host memory may be taken without giving any back (set by
        #: the tiered store from its books; None: always): a buffer touched ahead never
        #: makes the store write to disk for its room
        self.has_room: Callable[[int], bool] | None = None
        #: bytes touched ahead since the start, and the seconds it took (off the spills' path)
        self.ahead_total = 0
        self.ahead_s = 0.0
        self._ahead_size = 0
        self._ahead_thread: threading.Thread | None = None
        self._ahead_wake = threading.Event()
        self._closed = threading.Event()

    def alloc(self, nbytes: int) -> np.ndarray:
        if nbytes > self.largest_request:
            self.largest_request = nbytes
        view = self._from_arena(nbytes)
        if view is not None:
            self.taken_from["arena"] += nbytes
            if self.ahead_limit and self._arena_nearly_taken(nbytes):
                self.touch_ahead(nbytes)
            return view
        self.missed_arena()
        kept = self._reuse(nbytes)
        if kept is not None:
            self.taken_from["kept"] += nbytes
            self.touch_ahead(nbytes)
            return kept
        if self.before_new is not None:
            began = time.perf_counter()
            try:
                self.before_new(nbytes)
            finally:
                self.room_s += time.perf_counter() - began
            # what it wrote to disk may have freed arena slices
            view = self._from_arena(nbytes)
            if view is not None:
                self.taken_from["arena"] += nbytes
                return view
        began = time.perf_counter()
        try:
            return self._new(nbytes)
        finally:
            self.new_s += time.perf_counter() - began

    def _new(self, nbytes: int) -> np.ndarray:
        """A buffer that takes new host memory: pinned within the limit, else pageable."""
        if self.pinned is not None:
            with self._lock:
                take = self._within_pinned_limit(nbytes)
                if take:
                    self.pinned_bytes += nbytes
            if take:
                try:
                    buffer = self.pinned(nbytes)
                except BaseException:
                    with self._lock:
                        self.pinned_bytes -= nbytes
                    raise
                with self._lock:
                    self._on_demand[_address(buffer)] = nbytes
                self.taken_from["pinned"] += nbytes
                return buffer
        buffer = self.pageable(nbytes)
        self.taken_from["pageable"] += nbytes
        with self._lock:
            self.pageable_total += nbytes
            self.pageable_bytes += nbytes
            self._pageable[_address(buffer)] = nbytes
        self.touch_ahead(nbytes)
        return buffer

    # --- pageable buffers touched ahead of the spills

    def touch_ahead(self, nbytes: int) -> None:
        """Keep touched pageable buffers of ``nbytes`` ready for the next spills, up to
        :attr:`ahead_limit` bytes (at most :data:`AHEAD_VALUES`), taken on a thread of its
        own while the machine has room for them (:attr:`has_room`): the spills that would
        take new pageable buffers find kept ones instead. The latest size asked for is
        the one kept ready (a run spills chunks of the same few sizes)."""
        if not self.ahead_limit or nbytes < TOUCH_FROM or self._closed.is_set():
            return
        self._ahead_size = nbytes
        if self._ahead_thread is None:
            with self._lock:
                if self._ahead_thread is None:
                    self._ahead_thread = threading.Thread(target=self._ahead_loop, name="spillway-touch-ahead",
                                                          daemon=True)
                    self._ahead_thread.start()
        self._ahead_wake.set()

    def _arena_nearly_taken(self, nbytes: int) -> bool:
        """Whether the spills will soon take pageable buffers: the arena has less than the
        bytes kept ahead free, and nothing more will be pinned for it or on demand."""
        arena = self.arena
        return (arena is not None and arena.capacity - arena.used_bytes < self.ahead_limit
                and not self._within_pinned_limit(nbytes))

    def _ahead_loop(self) -> None:
        while not self._closed.is_set():
            self._ahead_wake.wait()  # set by touch_ahead, and by close
            self._ahead_wake.clear()
            try:
                while self._take_one_ahead():
                    pass
            except Exception:  # noqa: BLE001 (the spills take their own buffers meanwhile)
                logger.debug("touching pageable buffers ahead failed", exc_info=True)
                self._closed.wait(1.0)

    def _take_one_ahead(self) -> bool:
        """Touch one pageable buffer of the size kept ahead and keep it; False where enough
        are kept, the host tier's cache is full, or the machine has no room for one."""
        size = self._ahead_size
        if not size or self._closed.is_set():
            return False
        with self._lock:
            want = max(1, min(AHEAD_VALUES, self.ahead_limit // size))
            if len(self._kept.get(size, ())) >= want:
                return False
            if self.kept_bytes + self.pageable_bytes + size > self.pageable_cache:
                return False
        has_room = self.has_room
        if has_room is not None and not has_room(size):
            return False
        began = time.perf_counter()
        buffer = self.pageable(size)
        with self._lock:
            self._kept.setdefault(size, []).append((time.monotonic(), buffer))
            self.kept_bytes += size
            self.ahead_total += size
        self.ahead_s += time.perf_counter() - began
        return True

    def _reuse(self, nbytes: int) -> np.ndarray | None:
        """A kept pageable buffer of ``nbytes``, where the pinned path would not take the
        request (a pinned buffer within the limit copies faster than a kept pageable one)."""
        with self._lock:
            kept = self._kept.get(nbytes)
            if not kept or (self.pinned is not None and self._within_pinned_limit(nbytes)):
                return None
            _, buffer = kept.pop()
            if not kept:
                del self._kept[nbytes]
            self.kept_bytes -= nbytes
            self.pageable_bytes += nbytes
            self._pageable[_address(buffer)] = nbytes
            return buffer

    def give_back(self) -> int:
        """Drop every kept pageable buffer and the pinned blocks CuPy's pool caches
        (``trim``); returns the pageable bytes dropped."""
        with self._lock:
            gone, dropped, self._kept, self.kept_bytes = self._kept, self.kept_bytes, {}, 0
        # freed here, not under the lock: unmapping tens of GB would hold every spill's
        # alloc and release for as long
        del gone
        if self.trim is not None:
            self.trim()
        return dropped

    def expire(self, idle_s: float, now: float | None = None) -> int:
        """Drop the kept pageable buffers given back more than ``idle_s`` seconds ago (a
        worker done spilling gives the host its memory back); returns the bytes dropped."""
        now = time.monotonic() if now is None else now
        gone: list = []
        with self._lock:
            for nbytes in list(self._kept):
                fresh = [(t, b) for t, b in self._kept[nbytes] if now - t <= idle_s]
                gone.append(self._kept[nbytes])
                if fresh:
                    self._kept[nbytes] = fresh
                else:
                    del self._kept[nbytes]
            dropped = self.kept_bytes - sum(n * len(v) for n, v in self._kept.items())
            self.kept_bytes -= dropped
        del gone  # freed outside the lock, as in give_back
        return dropped

    def missed_arena(self) -> None:
        """A buffer that should have been pinned found no arena slice: the arena's growth
        pins its segments from now on without waiting for a quiet worker (:attr:`wanted`)."""
        if not self.wanted.is_set():
            self.wanted.set()

    def _from_arena(self, nbytes: int) -> np.ndarray | None:
        arena = self.arena
        return arena.allocate(nbytes) if arena is not None else None

    def arena_fits(self, nbytes: int) -> bool:
        """Whether one slice of ``nbytes`` fits the arena now (a fragmented arena with that
        much free in all may not hold it in one piece)."""
        arena = self.arena
        return arena is not None and arena.fits(nbytes)

    @property
    def held_bytes(self) -> int:
        """Host memory these buffers hold from the machine: the arena (taken whole, used
        or not), segments being taken, on-demand pinned and pageable buffers in use, and
        pageable buffers kept for reuse."""
        with self._lock:
            return self._held() + self.pageable_bytes + self.kept_bytes

    def release(self, buffer: np.ndarray) -> None:
        arena = self.arena
        if arena is not None and arena.owns(buffer):
            arena.free(buffer)
            return
        address = _address(buffer)
        with self._lock:
            nbytes = self._on_demand.pop(address, None)
            if nbytes is not None:
                self.pinned_bytes -= nbytes
                return
            nbytes = self._pageable.pop(address, None)
            if nbytes is not None:
                self.pageable_bytes -= nbytes
                # kept and in use together within the cache: pageable memory never holds
                # more than it could while none was kept
                if self.kept_bytes + self.pageable_bytes + nbytes <= self.pageable_cache:
                    self._kept.setdefault(nbytes, []).append((time.monotonic(), buffer))
                    self.kept_bytes += nbytes

    # --- arena growth (called by the growth thread)

    def _within_pinned_limit(self, nbytes: int) -> bool:
        return self.pinned_limit is None or self._held() + nbytes <= self.pinned_limit

    def _held(self) -> int:
        arena = self.arena
        return (arena.capacity if arena is not None else 0) + self._arena_reserved + self.pinned_bytes

    def reserve_segment(self, nbytes: int) -> bool:
        """Count ``nbytes`` against the pinned limit before a segment is taken; False when
        they do not fit beside what is already held."""
        with self._lock:
            if not self._within_pinned_limit(nbytes):
                return False
            self._arena_reserved += nbytes
            return True

    def add_segment(self, buffer: np.ndarray, reserved: int) -> None:
        """Hand a segment taken after :meth:`reserve_segment` to the arena; its bytes move
        from reserved to the arena at once, so the limit check never sees them twice or
        not at all."""
        with self._lock:
            try:
                arena = self.arena if self.arena is not None else Arena()
                arena.add(buffer)
                self.arena = arena
            finally:
                self._arena_reserved -= reserved

    def cancel_segment(self, reserved: int) -> None:
        with self._lock:
            self._arena_reserved -= reserved

    def grow_arena(self, target: int, take: Callable[[int], np.ndarray], **kwargs):
        """Start growing the arena to ``target`` bytes on a background thread; returns
        the :class:`~spillway.memory.growth.ArenaGrowth` (see there for ``kwargs``)."""
        from .growth import ArenaGrowth

        if self.growth is not None:
            raise RuntimeError("the arena is already growing")
        self.growth = ArenaGrowth(self, target, take, **kwargs)
        self.growth.start()
        return self.growth

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the arena's growth: no segment is taken after this returns (one being
        taken when it is called is handed back to its owner's garbage collector)."""
        self._closed.set()
        self._ahead_wake.set()
        if self.growth is not None:
            self.growth.stop(timeout)

    def summary(self) -> dict:
        """The host buffers' state, for the store's summary: when the arena became ready
        tells whether a timed run spilled into it or into buffers pinned on demand."""
        arena = self.arena
        out = {
            "arena_bytes": arena.capacity if arena is not None else 0,
            "arena_used_bytes": arena.used_bytes if arena is not None else 0,
            "arena_segments": arena.segments if arena is not None else 0,
            "pinned_on_demand_bytes": self.pinned_bytes,
            "pageable_total": self.pageable_total,
            "pageable_bytes": self.pageable_bytes,
            "pageable_kept_bytes": self.kept_bytes,
            "taken_from": dict(self.taken_from),
            "room_s": self.room_s,
            "new_s": self.new_s,
            "touched_ahead": self.ahead_total,
            "ahead_s": self.ahead_s,
        }
        if self.growth is not None:
            out.update(self.growth.summary())
        return out


def _address(buffer: np.ndarray) -> int:
    return buffer.__array_interface__["data"][0]


class HostTier(MoveRates):
    """Spilled segments in host buffers (a :class:`~spillway.memory.tier.SegmentTier`):
    what the device's values are copied into, and the way back to the device from every
    tier below. Its buffers come from :attr:`buffers`; a segment put here is a buffer of
    theirs, and :meth:`delete` gives it back to them."""

    name = "host"
    where = "host memory"

    def __init__(self, buffers: HostBuffers, limit: int | None = None):
        self.buffers = buffers
        #: bytes its segments may hold (None: no limit; the machine's own room is the
        #: books' to say, buffer by buffer)
        self.limit = limit
        self.nbytes = 0
        self._held: dict = {}

    def room(self) -> int | None:
        return None if self.limit is None else max(0, self.limit - self.nbytes)

    def put(self, key, copy: HostCopy, itemsize: int = 8) -> None:
        self._held[key] = copy.buffer
        self.nbytes += copy.nbytes

    def get(self, key, alloc: Alloc) -> HostCopy:
        buffer = self._held[key]  # already in host memory: no copy
        return HostCopy((buffer.nbytes,), buffer.dtype, "C", buffer)

    def take(self, key) -> np.ndarray:
        """Take ``key``'s buffer out of the tier without giving it back (a restore copies
        from it, then gives it back)."""
        buffer = self._held.pop(key)
        self.nbytes -= buffer.nbytes
        return buffer

    def delete(self, key) -> None:
        self.buffers.release(self.take(key))

    def close(self) -> None:
        self.buffers.close()  # stops the pinned arena's growth
