"""How device memory moves between the device tier and host buffers.

The store's tier logic is the same on GPU and CPU; only the codec differs. A codec sees a
stored array as a view of an *allocation* (the buffer it, and maybe other stored arrays,
point into): the store counts and frees allocations, and moves the byte ranges that views
span, so arrays that share memory are copied once and come back sharing it.

The CuPy codec copies to and from pinned host buffers on its own CUDA streams (one per
direction, so spills and restores use both copy engines and overlap compute). A codec is
any object with its methods (``is_device``, ``view``, ``ready``, ``to_host``,
``to_device``, ``rebuild``): the tests run the real store with NumPy arrays in the device
tier's place (tests/helpers/numpy_codec.py), and nothing in the store knows which codec
it has.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Alloc = Callable[[int], np.ndarray]


@dataclass
class HostCopy:
    """Bytes in a host buffer, with the shape and type they are read back as (the disk
    tier's unit)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    order: str
    buffer: np.ndarray  # uint8, nbytes long

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)


def extent(ptr: int, shape, strides, itemsize: int) -> tuple[int, int]:
    """The address range ``[start, end)`` an array view spans (empty for no elements)."""
    if any(n == 0 for n in shape):
        return ptr, ptr
    low = sum(s * (n - 1) for n, s in zip(shape, strides) if s < 0)
    high = sum(s * (n - 1) for n, s in zip(shape, strides) if s > 0)
    return ptr + low, ptr + high + itemsize


@dataclass(frozen=True)
class View:
    """Where an array lies: the allocation it points into and its layout there."""

    allocation: int  # the allocation's start address: its identity while it lives
    allocation_bytes: int
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype

    @property
    def extent(self) -> tuple[int, int]:
        return extent(self.ptr, self.shape, self.strides, self.dtype.itemsize)

    @property
    def nbytes(self) -> int:
        """Bytes of its elements: a strided view may span far more than it holds."""
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


class CupyCodec:
    """CuPy arrays, copied on non-blocking streams so kernels on other streams keep running."""

    def __init__(self):
        import cupy

        self.cupy = cupy

    # Made on first use, not with the store: distributed builds the store before the
    # worker starts, and a CUDA context that exists by then makes dask-cuda's start-up
    # warn "A CUDA context for device N already exists" on every TCP worker.
    @functools.cached_property
    def d2h(self):
        return self.cupy.cuda.Stream(non_blocking=True)

    @functools.cached_property
    def h2d(self):
        return self.cupy.cuda.Stream(non_blocking=True)

    def is_device(self, value) -> bool:
        return isinstance(value, self.cupy.ndarray)

    def view(self, array) -> View:
        mem = array.data.mem
        if mem is None:  # no elements, no allocation
            return View(0, 0, 0, tuple(array.shape), tuple(array.strides), array.dtype)
        return View(int(mem.ptr), int(mem.size), int(array.data.ptr), tuple(array.shape),
                    tuple(array.strides), array.dtype)

    def ready(self, value) -> None:
        """Wait for the kernels queued on the current stream, which may still be writing
        ``value``."""
        self.cupy.cuda.get_current_stream().record().synchronize()

    def to_host(self, ptr: int, nbytes: int, alloc: Alloc) -> np.ndarray:
        cupy = self.cupy
        runtime = cupy.cuda.runtime
        buf = alloc(nbytes)
        if nbytes:
            # wait for the kernels that produced the bytes, then copy on our own stream
            self.d2h.wait_event(cupy.cuda.get_current_stream().record())
            if self._staged(buf, nbytes):
                ring = self._down[0]

                def to_slot(slot: int, offset: int, n: int):
                    runtime.memcpyAsync(ring.slots[slot].ctypes.data, ptr + offset, n,
                                        runtime.memcpyDeviceToHost, self.d2h.ptr)
                    return self.d2h.synchronize

                ring.to_host(buf, nbytes, to_slot)
            else:
                runtime.memcpyAsync(buf.ctypes.data, ptr, nbytes, runtime.memcpyDeviceToHost, self.d2h.ptr)
                self.d2h.synchronize()
        return buf

    def to_device(self, buffer: np.ndarray):
        cupy = self.cupy
        runtime = cupy.cuda.runtime
        nbytes = buffer.nbytes
        out = cupy.empty(nbytes, dtype=cupy.uint8)
        if nbytes:
            # RMM hands out memory in the order of the current stream: `out` may reuse
            # bytes that kernels queued there still read. Copying on our own stream before
            # they finish would overwrite their inputs, so wait for them first.
            self.h2d.wait_event(cupy.cuda.get_current_stream().record())
            if self._staged(buffer, nbytes):
                ring, events = self._up

                def from_slot(slot: int, offset: int, n: int):
                    runtime.memcpyAsync(out.data.ptr + offset, ring.slots[slot].ctypes.data, n,
                                        runtime.memcpyHostToDevice, self.h2d.ptr)
                    events[slot].record(self.h2d)
                    return events[slot].synchronize

                ring.to_device(buffer, nbytes, from_slot)
            else:
                runtime.memcpyAsync(out.data.ptr, buffer.ctypes.data, nbytes, runtime.memcpyHostToDevice,
                                    self.h2d.ptr)
            self.h2d.synchronize()
        return out

    # --- pageable buffers through pinned slots (:mod:`spillway.memory.staging`)

    def _staged(self, buffer: np.ndarray, nbytes: int) -> bool:
        """Whether a copy of ``nbytes`` to or from ``buffer`` goes through the staging
        ring: a buffer that is not page-locked (past the pinned arena), of a slot or more."""
        from .staging import SLOT_BYTES

        if nbytes < SLOT_BYTES:
            return False
        try:
            kind = self.cupy.cuda.runtime.pointerGetAttributes(buffer.ctypes.data).type
        except Exception:  # noqa: BLE001 (a pointer CUDA cannot say: the plain copy)
            return False
        return kind == 0  # cudaMemoryTypeUnregistered: pageable memory

    def _ring(self):
        import cupyx

        from .staging import SLOT_BYTES, SLOTS, StagingRing

        slots = [cupyx.empty_pinned(SLOT_BYTES, dtype=np.uint8) for _ in range(SLOTS)]
        return StagingRing(slots), [self.cupy.cuda.Event(disable_timing=True) for _ in slots]

    @functools.cached_property
    def _down(self):
        return self._ring()

    @functools.cached_property
    def _up(self):
        return self._ring()

    def rebuild(self, allocation, offset: int, shape, strides, dtype):
        return self.cupy.ndarray(shape, dtype, memptr=allocation.data + offset, strides=strides)
