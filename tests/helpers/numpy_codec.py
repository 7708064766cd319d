"""NumPy arrays in the device tier's place: the codec the CPU tests run the real tiered
store with (the workers use :class:`~spillway.memory.codecs.CupyCodec`)."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from spillway.memory.codecs import Alloc, View, extent


class NumpyCodec:
    """NumPy arrays as the "device" tier (CPU tests, and a reference implementation)."""

    def is_device(self, value: Any) -> bool:
        return isinstance(value, np.ndarray) and value.dtype != object

    def view(self, array) -> View:
        root = array
        while isinstance(root.base, np.ndarray):
            root = root.base
        start, end = extent(root.__array_interface__["data"][0], root.shape, root.strides, root.itemsize)
        return View(start, end - start, array.__array_interface__["data"][0], array.shape,
                    array.strides, array.dtype)

    def ready(self, value) -> None:
        """Return once ``value`` is computed (NumPy values always are)."""

    def to_host(self, ptr: int, nbytes: int, alloc: Alloc) -> np.ndarray:
        buf = alloc(nbytes)
        if nbytes:
            np.copyto(buf, np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr)))
        return buf

    def to_device(self, buffer: np.ndarray):
        out = np.empty(buffer.nbytes, dtype=np.uint8)
        out[:] = buffer
        return out

    def rebuild(self, allocation, offset: int, shape, strides, dtype):
        return np.ndarray(shape, dtype, buffer=allocation, offset=offset, strides=strides)
