"""Host buffers for spilled values: the pinned arena first, then pinned buffers taken on
demand within the worker's pinned limit, then pageable buffers."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from .arena import Arena


class HostBuffers:
    """Host buffers for spilled values: slices of the pinned arena while it has room; past
    it, pinned buffers taken on demand while the arena and those together stay within
    ``pinned_limit`` bytes; past that, pageable buffers. Pageable copies are slower, but
    page-locked memory cannot be swapped or reclaimed, and workers that pin more than
    their share of the host are what the kernel's out-of-memory killer ends.

    The arena may grow while the worker runs (:meth:`grow_arena`): its segments are taken
    on a background thread, and until they are, values take the on-demand path. Segments
    being taken count against ``pinned_limit`` from the moment they are reserved, so the
    arena, the segments in flight and the on-demand buffers never pass it together."""

    def __init__(
        self,
        arena: Arena | None = None,
        pinned: Callable[[int], np.ndarray] | None = None,
        *,
        pinned_limit: float = float("inf"),
        pageable: Callable[[int], np.ndarray] | None = None,
    ):
        self.arena = arena
        self.pinned = pinned
        self.pinned_limit = pinned_limit
        self.pageable = pageable or (lambda n: np.empty(n, dtype=np.uint8))
        #: bytes of on-demand pinned buffers handed out and not yet released
        self.pinned_bytes = 0
        #: bytes handed out as pageable buffers since the start (past the pinned limit)
        self.pageable_total = 0
        #: the largest buffer asked for so far (the arena's growth sizes segments from it)
        self.largest_request = 0
        #: the background thread growing the arena, if any
        self.growth = None
        self._arena_reserved = 0  # segments being taken, not yet in the arena
        self._on_demand: dict[int, int] = {}
        self._lock = threading.Lock()

    def alloc(self, nbytes: int) -> np.ndarray:
        if nbytes > self.largest_request:
            self.largest_request = nbytes
        arena = self.arena
        if arena is not None:
            view = arena.allocate(nbytes)
            if view is not None:
                return view
        if self.pinned is not None:
            with self._lock:
                take = self._held() + nbytes <= self.pinned_limit
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
                return buffer
        with self._lock:
            self.pageable_total += nbytes
        return self.pageable(nbytes)

    def arena_can_take(self, nbytes: int) -> bool:
        """Whether the arena has ``nbytes`` free (in all; a fragmented arena may not)."""
        arena = self.arena
        return arena is not None and arena.capacity - arena.used_bytes >= nbytes

    def release(self, buffer: np.ndarray) -> None:
        arena = self.arena
        if arena is not None and arena.owns(buffer):
            arena.free(buffer)
            return
        with self._lock:
            nbytes = self._on_demand.pop(_address(buffer), None)
            if nbytes is not None:
                self.pinned_bytes -= nbytes

    # --- arena growth (called by the growth thread)

    @property
    def pinned_held(self) -> int:
        """Pinned bytes counted against the limit: the arena, segments being taken, and
        on-demand buffers in use."""
        with self._lock:
            return self._held()

    def _held(self) -> int:
        arena = self.arena
        return (arena.capacity if arena is not None else 0) + self._arena_reserved + self.pinned_bytes

    def reserve_segment(self, nbytes: int) -> bool:
        """Count ``nbytes`` against the pinned limit before a segment is taken; False when
        they do not fit beside what is already held."""
        with self._lock:
            if self._held() + nbytes > self.pinned_limit:
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
        the :class:`~spillway.service.memory.growth.ArenaGrowth` (see there for ``kwargs``)."""
        from .growth import ArenaGrowth

        if self.growth is not None:
            raise RuntimeError("the arena is already growing")
        self.growth = ArenaGrowth(self, target, take, **kwargs)
        self.growth.start()
        return self.growth

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the arena's growth: no segment is taken after this returns (one being
        taken when it is called is handed back to its owner's garbage collector)."""
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
        }
        if self.growth is not None:
            out.update(self.growth.summary())
        return out


def _address(buffer: np.ndarray) -> int:
    return buffer.__array_interface__["data"][0]
