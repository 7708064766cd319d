"""How values move between the device tier and host buffers.

The store's tier logic is the same on GPU and CPU; only the codec differs. The CuPy codec
copies device arrays to and from pinned host buffers on their own CUDA streams (one per
direction, so spills and restores use both copy engines and overlap compute). The NumPy
codec puts NumPy arrays in the device tier's place: the tests exercise the real store with
it, and nothing in the store knows which codec it has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

Alloc = Callable[[int], np.ndarray]


@dataclass
class HostCopy:
    """A device array's bytes in a host buffer, with what it takes to rebuild it."""

    shape: tuple[int, ...]
    dtype: np.dtype
    order: str
    buffer: np.ndarray  # uint8, nbytes long

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)


def _layout(array) -> str | None:
    if array.flags.c_contiguous:
        return "C"
    if array.flags.f_contiguous:
        return "F"
    return None


class NumpyCodec:
    """NumPy arrays as the "device" tier (CPU tests, and a reference implementation)."""

    def is_device(self, value: Any) -> bool:
        return isinstance(value, np.ndarray) and value.dtype != object

    def nbytes(self, value) -> int:
        return int(value.nbytes)

    def ready(self, value) -> None:
        """Return once ``value`` is computed (NumPy values always are)."""

    def to_host(self, value, alloc: Alloc) -> HostCopy:
        order = _layout(value) or "C"
        src = np.asarray(value, order=order)
        buf = alloc(src.nbytes)
        np.copyto(buf, src.reshape(-1, order="A").view(np.uint8) if src.nbytes else buf)
        return HostCopy(src.shape, src.dtype, order, buf)

    def to_device(self, copy: HostCopy):
        out = np.empty(copy.shape, dtype=copy.dtype, order=copy.order)
        if copy.nbytes:
            out.reshape(-1, order="A").view(np.uint8)[:] = copy.buffer
        return out


class CupyCodec:
    """CuPy arrays, copied on non-blocking streams so kernels on other streams keep running."""

    def __init__(self):
        import cupy

        self.cupy = cupy
        self.d2h = cupy.cuda.Stream(non_blocking=True)
        self.h2d = cupy.cuda.Stream(non_blocking=True)

    def is_device(self, value) -> bool:
        return isinstance(value, self.cupy.ndarray)

    def nbytes(self, value) -> int:
        return int(value.nbytes)

    def ready(self, value) -> None:
        """Wait for the kernels queued on the current stream, which may still be writing
        ``value``."""
        self.cupy.cuda.get_current_stream().record().synchronize()

    def to_host(self, value, alloc: Alloc) -> HostCopy:
        cupy = self.cupy
        order = _layout(value)
        if order is None:  # a strided view: one device copy makes it contiguous
            value, order = cupy.ascontiguousarray(value), "C"
        buf = alloc(value.nbytes)
        if value.nbytes:
            # wait for the kernels that produced the value, then copy on our own stream
            self.d2h.wait_event(cupy.cuda.get_current_stream().record())
            cupy.cuda.runtime.memcpyAsync(
                buf.ctypes.data, value.data.ptr, value.nbytes,
                cupy.cuda.runtime.memcpyDeviceToHost, self.d2h.ptr,
            )
            self.d2h.synchronize()
        return HostCopy(tuple(value.shape), value.dtype, order, buf)

    def to_device(self, copy: HostCopy):
        cupy = self.cupy
        out = cupy.empty(copy.shape, dtype=copy.dtype, order=copy.order)
        if copy.nbytes:
            # RMM hands out memory in the order of the current stream: `out` may reuse
            # bytes that kernels queued there still read. Copying on our own stream before
            # they finish would overwrite their inputs, so wait for them first.
            self.h2d.wait_event(cupy.cuda.get_current_stream().record())
            cupy.cuda.runtime.memcpyAsync(
                out.data.ptr, copy.buffer.ctypes.data, copy.nbytes,
                cupy.cuda.runtime.memcpyHostToDevice, self.h2d.ptr,
            )
            self.h2d.synchronize()
        return out
