"""A first-fit allocator over one large host buffer taken once at worker start.

Pinned (page-locked) host memory costs seconds per tens of GB to allocate and touch, and
copies into it run at about three times the pageable rate. Taking it once, up front, and
handing out slices keeps both costs out of the spill path.
"""

from __future__ import annotations

import bisect
import threading

import numpy as np

ALIGN = 4096


class Arena:
    """Slices of one uint8 buffer; ``allocate`` returns None when nothing fits."""

    def __init__(self, buffer: np.ndarray):
        if buffer.dtype != np.uint8 or buffer.ndim != 1:
            raise ValueError("arena buffer must be 1-D uint8")
        self.buffer = buffer
        self.capacity = int(buffer.nbytes)
        self._lock = threading.Lock()
        self._free_starts: list[int] = [0]
        self._free_sizes: dict[int, int] = {0: self.capacity}
        self._used: dict[int, int] = {}

    @property
    def used_bytes(self) -> int:
        return sum(self._used.values())

    def allocate(self, nbytes: int) -> np.ndarray | None:
        size = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        with self._lock:
            for start in self._free_starts:
                free = self._free_sizes[start]
                if free >= size:
                    self._free_starts.remove(start)
                    del self._free_sizes[start]
                    if free > size:
                        rest = start + size
                        bisect.insort(self._free_starts, rest)
                        self._free_sizes[rest] = free - size
                    self._used[start] = size
                    return self.buffer[start : start + nbytes]
        return None

    def free(self, view: np.ndarray) -> None:
        start = view.__array_interface__["data"][0] - self.buffer.__array_interface__["data"][0]
        with self._lock:
            size = self._used.pop(start)
            i = bisect.bisect_left(self._free_starts, start)
            # merge with the following free block
            if i < len(self._free_starts) and self._free_starts[i] == start + size:
                nxt = self._free_starts.pop(i)
                size += self._free_sizes.pop(nxt)
            # merge with the preceding free block
            if i > 0:
                prev = self._free_starts[i - 1]
                if prev + self._free_sizes[prev] == start:
                    self._free_sizes[prev] += size
                    return
            self._free_starts.insert(i, start)
            self._free_sizes[start] = size

    def owns(self, view: np.ndarray) -> bool:
        base = self.buffer.__array_interface__["data"][0]
        ptr = view.__array_interface__["data"][0]
        return base <= ptr < base + self.capacity
