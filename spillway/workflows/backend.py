"""The array module of a chunk: CuPy on GPU workers, NumPy on CPU workers.

Workflow code is written against ``xp`` so the same code runs on both; CPU tests then
exercise the real code. CuPy is imported only inside tasks that run on GPU workers.
"""

from __future__ import annotations

CHUNK_BACKENDS = ("numpy", "cupy")


def array_module(backend: str):
    if backend == "cupy":
        import cupy

        return cupy
    if backend == "numpy":
        import numpy

        return numpy
    raise ValueError(f"backend: {backend!r} is not one of {', '.join(CHUNK_BACKENDS)}")


def chunk_backend_for(kind: str) -> str:
    """The chunk backend for a worker kind ("gpu" or "cpu")."""
    return "cupy" if kind == "gpu" else "numpy"


def module_of(array):
    """The array module an array belongs to (CuPy or NumPy), without importing CuPy."""
    import numpy

    if type(array).__module__.startswith("cupy"):
        import cupy

        return cupy
    return numpy


def to_numpy(array):
    """A NumPy copy of a host or device array (or scalar)."""
    import numpy

    if hasattr(array, "get") and type(array).__module__.startswith("cupy"):
        return array.get()
    return numpy.asarray(array)


def to_device(block):
    """A CuPy copy of a host block (runs inside tasks on GPU workers)."""
    import cupy

    return cupy.asarray(block)


def device_meta(dtype, ndim: int):
    """An empty CuPy array: the dask ``meta`` of device-chunked arrays."""
    import cupy

    return cupy.empty((0,) * ndim, dtype=dtype)
