"""Array results written to a Zarr v3 store by the workers, chunk by chunk, in parallel.

The store is created on the client (metadata only); each worker then writes the chunks
it computed, so nothing passes through the client. Device chunks are copied to host
memory inside the writing task, on the worker that holds them.
"""

from __future__ import annotations

import os

import numpy as np

from service.errors import ParamError


def check_path(path: str) -> str:
    """The output path, refused before anything runs when it cannot be written."""
    path = os.path.abspath(os.path.expanduser(path))
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise ParamError(f"output: directory {parent!r} does not exist")
    if os.path.exists(path) and not os.path.exists(os.path.join(path, "zarr.json")):
        raise ParamError(f"output: {path!r} exists and is not a Zarr v3 store; refusing to overwrite it")
    return path


def _to_host(block):
    from .backend import to_numpy

    return to_numpy(block)


def _regular(chunks) -> bool:
    return all(len(set(c[:-1])) <= 1 and (len(c) == 1 or c[-1] <= c[0]) for c in chunks)


def zarr_store(array, path: str):
    """A lazy dask collection that writes ``array`` to a Zarr v3 store at ``path``."""
    import dask.array as da

    host = array.map_blocks(_to_host, meta=np.empty((0,) * array.ndim, dtype=array.dtype))
    if not _regular(host.chunks):  # Zarr chunks are a regular grid
        host = host.rechunk(tuple(max(c) for c in host.chunks))
    return da.to_zarr(host, check_path(path), compute=False, mode="w", zarr_format=3)


def nbytes(array) -> int:
    return int(np.prod(array.shape, dtype=object)) * array.dtype.itemsize if array is not None else 0
