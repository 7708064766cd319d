"""Array results written to a Zarr v3 store by the workers, chunk by chunk, in parallel.

The store is created on the client (metadata only); each worker then writes the chunks
it computed, so nothing passes through the client. How (uncompressed chunks; device
chunks straight from GPU memory with KvikIO) is :mod:`.zarr`'s to decide.

:func:`open_output` reads a store back as a lazy array, for ``cluster.open(...)`` and a
service job's ``JobResult.array`` alike (which says where the service's results are
mounted when there is no store): here, not in the HTTP client, so that a plain
install (no httpx) opens results too.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from spillway.options.errors import ParamError


def check_path(path: str) -> str:
    """The output path, refused before anything runs when it cannot be written: its
    directory missing, or one where nothing can be made (a read-only mount, /proc, no
    permission: a directory is made there and removed again, as the store would be)."""
    path = os.path.abspath(os.path.expanduser(path))
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise ParamError(f"output: directory {parent!r} does not exist")
    if os.path.exists(path) and not os.path.exists(os.path.join(path, "zarr.json")):
        raise ParamError(f"output: {path!r} exists and is not a Zarr v3 store; refusing to overwrite it")
    probe_in = path if os.path.isdir(path) else parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".spillway-probe-", dir=probe_in))
    except OSError as e:
        raise ParamError(f"output: cannot write in {probe_in!r} ([Errno {e.errno}] {e.strerror})") from None
    return path


def check_space(path: str, nbytes: int) -> None:
    """Refuse an output of ``nbytes`` (its chunks as written: uncompressed) where the disk
    of ``path`` has less free space."""
    from spillway.options.sizes import format_bytes

    where = path if os.path.isdir(path) else os.path.dirname(path) or "."
    free = shutil.disk_usage(where).free
    # an existing store is replaced: what it holds is freed first
    if os.path.isdir(path):
        free += stored_bytes(path)
    if nbytes > free:
        raise ParamError(f"output: {path} needs {format_bytes(nbytes)} but its disk has {format_bytes(free)} free")


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


def _gpu_available() -> bool:
    try:
        import cupy
    except ImportError:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no driver or no device: CuPy imports but cannot run
        return False


def open_output(path: str, *, backend: str = "auto"):
    """A lazy dask array over a Zarr v3 store written by a run.

    ``backend``: ``numpy``, ``cupy`` (each chunk read into device memory, with KvikIO
    where it is installed: :mod:`spillway.workflows.zarr`), or ``auto`` (CuPy where it is
    installed and a GPU is visible).
    """
    from spillway.workflows.zarr.read import open_array

    if backend not in ("auto", "numpy", "cupy"):
        raise ValueError(f"backend: {backend!r} is not one of auto, numpy, cupy")
    if not os.path.exists(os.path.join(path, "zarr.json")):
        raise ParamError(f"open: no Zarr store at {path!r}")
    on_device = backend == "cupy" or (backend == "auto" and _gpu_available())
    return open_array(path, "cupy" if on_device else "numpy")
