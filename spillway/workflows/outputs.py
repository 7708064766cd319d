"""Array results written to a Zarr v3 store by the workers, chunk by chunk, in parallel.

The store is created on the client (metadata only); each worker then writes the chunks
it computed, so nothing passes through the client. How (uncompressed chunks; device
chunks straight from GPU memory with KvikIO) is :mod:`.zarr`'s to decide.
"""

from __future__ import annotations

import os
import shutil

from spillway.service.errors import ParamError


def check_path(path: str) -> str:
    """The output path, refused before anything runs when it cannot be written."""
    path = os.path.abspath(os.path.expanduser(path))
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise ParamError(f"output: directory {parent!r} does not exist")
    if os.path.exists(path) and not os.path.exists(os.path.join(path, "zarr.json")):
        raise ParamError(f"output: {path!r} exists and is not a Zarr v3 store; refusing to overwrite it")
    return path


def zarr_store(array, path: str):
    """A lazy dask collection that writes ``array`` to a Zarr v3 store at ``path``."""
    from .zarr.write import store

    return store(array, check_path(path))


def remove_output(path: str) -> None:
    """Remove a store that is not a result (a failed or cancelled write)."""
    shutil.rmtree(path, ignore_errors=True)


def stored_bytes(path: str) -> int:
    """Bytes of the chunk files in a Zarr store, measured on disk (metadata excluded)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            if f != "zarr.json":
                total += os.path.getsize(os.path.join(root, f))
    return total
