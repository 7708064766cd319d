"""Zarr accepts device (CuPy) chunks on GPU workers: they are copied to the host where zarr
takes them in, so ``da.to_zarr``, ``da.store`` into a zarr array and
``xarray.Dataset.to_zarr`` of CuPy-backed arrays write instead of failing.

Why this is needed: dask's ``store`` hands each chunk to ``zarr_array[region] = chunk``,
and zarr wraps the value in its configured ``NDBuffer``. The default CPU buffer keeps the
CuPy array, and zarr's codec pipeline then assigns it into a NumPy chunk, which CuPy
refuses ("Implicit conversion to a NumPy array is not allowed").

Why a host buffer rather than zarr's GPU mode (``zarr.config.enable_gpu()``): GPU mode
also changes what zarr *reads* into (CuPy for every ``zarr`` read on the worker, while
``da.from_zarr`` still says its chunks are NumPy), and zarr 3.4 has no GPU codec, so its
stores and compressors copy every GPU buffer to the host anyway. The host buffer changes
only the case that fails today: a device value given to zarr is copied once to the host;
everything else is zarr's CPU path unchanged. Spillway's own outputs do not go through it
(:mod:`spillway.workflows.zarr.write` writes device chunks straight from GPU memory with
KvikIO).

:func:`install` is run by the worker plugin on every GPU worker (``spillway.launch.plugins``);
it lives with the cluster, not the workflows, because it is how a GPU worker takes any
zarr write, the user's own included.
"""

from __future__ import annotations

from zarr.core.buffer import cpu

#: the name zarr's config refers to the buffer by (``zarr.config["ndbuffer"]``): this
#: module's path and the class name, so that it names the class wherever it is read
QUALNAME = "spillway.memory.zarr_buffer.HostNDBuffer"


def to_host(value):
    """A NumPy copy of a device array (CuPy's ``.get()``, else through CuPy for any
    ``__cuda_array_interface__`` exporter); host arrays are returned as they are."""
    if not hasattr(value, "__cuda_array_interface__"):
        return value
    get = getattr(value, "get", None)
    if callable(get):
        return get()
    import cupy

    return cupy.asnumpy(cupy.asarray(value))


class HostNDBuffer(cpu.NDBuffer):
    """Zarr's CPU ``NDBuffer`` that copies a device value to the host when zarr takes it
    in; reads, codecs and stores are zarr's CPU path unchanged."""

    @classmethod
    def from_ndarray_like(cls, ndarray_like):
        return super().from_ndarray_like(to_host(ndarray_like))


def install() -> None:
    """Register :class:`HostNDBuffer` and make it zarr's default in this process, where
    zarr still has the shape it was written against (the seam says so once where not, and
    zarr's own buffer stays)."""
    from spillway import upstream

    upstream.use_ndbuffer(HostNDBuffer, QUALNAME)


def installed() -> bool:
    from spillway import upstream

    return upstream.ndbuffer_name() == QUALNAME
