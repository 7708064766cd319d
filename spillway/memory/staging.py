"""Copies between the device and pageable host buffers at the pinned link's rate.

The pinned arena holds a share of the host (half of it, between the workers); a host tier
larger than that keeps the rest of its values in pageable buffers, and a copy between a
pageable buffer and the device runs on one thread of the driver through its own small
pinned buffers: 19.3 GB/s device to host on the GPU hosts, against 55 GB/s pinned. Here
a copy goes through a ring of pinned slots instead: the copy engine fills (or drains)
one slot while a few threads move the slot before it to (or from) the pageable buffer,
each a piece, with the GIL released (``ctypes.memmove``). The two overlap, so the copy
runs at the slower of the link and the threads' memcpy, which several threads keep near
the link.

The ring is generic over the device side: ``to_slot(slot, offset, nbytes)`` starts the
copy engine's copy of ``nbytes`` at ``offset`` into a slot (device to host) and returns
what to wait on; ``from_slot`` the other way. The CuPy codec gives it its copies and
events (:class:`~spillway.memory.codecs.CupyCodec`); the tests give it NumPy copies.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

#: bytes of one slot, and the slots of a ring: two let the copy engine and the threads
#: work on one each
SLOT_BYTES = 64 << 20
SLOTS = 2
#: threads moving a slot's bytes, each a piece of it
THREADS = 4

Waitable = Callable[[], None]


class StagingRing:
    """Pinned slots (``slots``: 1-D uint8 buffers of one size) and threads that move
    their bytes to and from host buffers; one copy at a time (a lock), one ring each way."""

    def __init__(self, slots: list[np.ndarray], threads: int = THREADS):
        if not slots or len({s.nbytes for s in slots}) != 1:
            raise ValueError("a staging ring needs slots of one size")
        self.slots = slots
        self.slot_bytes = int(slots[0].nbytes)
        self.threads = max(1, int(threads))
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="spillway-staging")
        self._lock = threading.Lock()

    def _pieces(self, dst: int, src: int, nbytes: int) -> list:
        piece = -(-nbytes // self.threads)
        return [self._pool.submit(ctypes.memmove, dst + at, src + at, min(piece, nbytes - at))
                for at in range(0, nbytes, piece)]

    def to_host(self, dst: np.ndarray, nbytes: int, to_slot: Callable[[int, int, int], Waitable]) -> None:
        """Fill ``dst`` (a host buffer of at least ``nbytes``) from the device: the copy
        engine into a slot (``to_slot(slot, offset, n)``, waited on before the slot is
        read), the threads from the slot into ``dst``, one slot behind."""
        base = dst.ctypes.data
        with self._lock:
            moving: list[list] = [[] for _ in self.slots]
            try:
                for k, offset in enumerate(range(0, nbytes, self.slot_bytes)):
                    s = k % len(self.slots)
                    n = min(self.slot_bytes, nbytes - offset)
                    _done(moving[s])  # the slot's last bytes are out
                    to_slot(s, offset, n)()
                    moving[s] = self._pieces(base + offset, self.slots[s].ctypes.data, n)
            finally:
                for futures in moving:
                    _done(futures)

    def to_device(self, src: np.ndarray, nbytes: int, from_slot: Callable[[int, int, int], Waitable]) -> None:
        """Copy ``nbytes`` of ``src`` (a host buffer) to the device: the threads into a
        slot, then the copy engine from it (``from_slot(slot, offset, n)``), whose copy is
        waited on before the slot is filled again and once all are started."""
        base = src.ctypes.data
        with self._lock:
            engine: list[Waitable | None] = [None] * len(self.slots)
            try:
                for k, offset in enumerate(range(0, nbytes, self.slot_bytes)):
                    s = k % len(self.slots)
                    n = min(self.slot_bytes, nbytes - offset)
                    if engine[s] is not None:
                        engine[s]()  # the copy engine has read the slot
                        engine[s] = None
                    _done(self._pieces(self.slots[s].ctypes.data, base + offset, n))
                    engine[s] = from_slot(s, offset, n)
            finally:
                for waiting in engine:
                    if waiting is not None:
                        waiting()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _done(futures: list) -> None:
    """Wait for ``futures``, raising the first one's error."""
    if futures:
        wait(futures)
        for f in futures:
            f.result()
