"""A first-fit allocator over pinned host buffers (segments) taken once per worker.

Pinned (page-locked) host memory costs seconds per tens of GB to allocate and touch, and
copies into it run at about three times the pageable rate. Taking it once and handing out
slices keeps both costs out of the spill path. The arena is made of segments so that it
can grow while the worker runs (:mod:`spillway.memory.growth` adds them one by one); a
slice never spans two segments, since two separate pinned allocations need not be
adjacent in memory.
"""

from __future__ import annotations

import bisect
import threading

import numpy as np

ALIGN = 4096


class _Segment:
    """First-fit slices of one uint8 buffer (callers hold the arena's lock)."""

    def __init__(self, buffer: np.ndarray):
        self.buffer = buffer
        self.base = _address(buffer)
        self.capacity = int(buffer.nbytes)
        self.free_starts: list[int] = [0]
        self.free_sizes: dict[int, int] = {0: self.capacity}
        self.used: dict[int, int] = {}

    def allocate(self, size: int, nbytes: int) -> np.ndarray | None:
        for start in self.free_starts:
            free = self.free_sizes[start]
            if free >= size:
                self.free_starts.remove(start)
                del self.free_sizes[start]
                if free > size:
                    rest = start + size
                    bisect.insort(self.free_starts, rest)
                    self.free_sizes[rest] = free - size
                self.used[start] = size
                return self.buffer[start : start + nbytes]
        return None

    def free(self, start: int) -> int:
        size = self.used.pop(start)
        freed = size
        i = bisect.bisect_left(self.free_starts, start)
        # merge with the following free block
        if i < len(self.free_starts) and self.free_starts[i] == start + size:
            nxt = self.free_starts.pop(i)
            size += self.free_sizes.pop(nxt)
        # merge with the preceding free block
        if i > 0:
            prev = self.free_starts[i - 1]
            if prev + self.free_sizes[prev] == start:
                self.free_sizes[prev] += size
                return freed
        self.free_starts.insert(i, start)
        self.free_sizes[start] = size
        return freed


class Arena:
    """Slices of one or more uint8 buffers; ``allocate`` returns None when nothing fits.

    Segments are tried in the order they were added, so the first ones fill up first and
    a value finds room as soon as any segment has it."""

    def __init__(self, *buffers: np.ndarray):
        self._lock = threading.Lock()
        self._segments: list[_Segment] = []  # in the order added: first-fit order
        self._by_base: list[tuple[int, _Segment]] = []  # sorted by address: owner lookup
        self.capacity = 0
        self.used_bytes = 0
        for buffer in buffers:
            self.add(buffer)

    @property
    def segments(self) -> int:
        return len(self._segments)

    def add(self, buffer: np.ndarray) -> None:
        if buffer.dtype != np.uint8 or buffer.ndim != 1:
            raise ValueError("arena buffer must be 1-D uint8")
        segment = _Segment(buffer)
        with self._lock:
            self._segments.append(segment)
            bisect.insort(self._by_base, (segment.base, segment), key=lambda e: e[0])
            self.capacity += segment.capacity

    def allocate(self, nbytes: int) -> np.ndarray | None:
        size = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        with self._lock:
            for segment in self._segments:
                if segment.capacity >= size:
                    view = segment.allocate(size, nbytes)
                    if view is not None:
                        self.used_bytes += size
                        return view
        return None

    def fits(self, nbytes: int) -> bool:
        """Whether :meth:`allocate` of ``nbytes`` would find a slice now."""
        size = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        with self._lock:
            return any(free >= size for segment in self._segments for free in segment.free_sizes.values())

    def free(self, view: np.ndarray) -> None:
        ptr = _address(view)
        with self._lock:
            segment = self._owner(ptr)
            if segment is None:
                raise ValueError("buffer is not a slice of this arena")
            self.used_bytes -= segment.free(ptr - segment.base)

    def owns(self, view: np.ndarray) -> bool:
        with self._lock:
            return self._owner(_address(view)) is not None

    def _owner(self, ptr: int) -> _Segment | None:
        i = bisect.bisect_right(self._by_base, ptr, key=lambda e: e[0]) - 1
        if i >= 0:
            segment = self._by_base[i][1]
            if ptr < segment.base + segment.capacity:
                return segment
        return None


def _address(buffer: np.ndarray) -> int:
    return buffer.__array_interface__["data"][0]
