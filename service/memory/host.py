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
    their share of the host are what the kernel's out-of-memory killer ends."""

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
        self._on_demand: dict[int, int] = {}
        self._lock = threading.Lock()

    def alloc(self, nbytes: int) -> np.ndarray:
        arena = self.arena
        if arena is not None:
            view = arena.allocate(nbytes)
            if view is not None:
                return view
        if self.pinned is not None:
            with self._lock:
                held = (arena.capacity if arena is not None else 0) + self.pinned_bytes
                take = held + nbytes <= self.pinned_limit
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

    def release(self, buffer: np.ndarray) -> None:
        if self.arena is not None and self.arena.owns(buffer):
            self.arena.free(buffer)
            return
        with self._lock:
            nbytes = self._on_demand.pop(_address(buffer), None)
            if nbytes is not None:
                self.pinned_bytes -= nbytes


def _address(buffer: np.ndarray) -> int:
    return buffer.__array_interface__["data"][0]
