"""An array output: written, measured and read back; a failed or wrong store is removed
and fails the run with :class:`~spillway.options.errors.OutputError`."""

from __future__ import annotations

import errno

from spillway.workflows.outputs import remove_output

from spillway.options.errors import OutputError
from .host import on_host


#: what the OS says of a store its user can put right (space, permissions, a directory
#: that went away): the run exits 2, as for any bad value
USERS_TO_FIX = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT,
                errno.ENOTDIR}


def wait_for_store(future, path: str) -> None:
    """Wait for the store future; a failed write removes what was written and fails the run."""
    try:
        future.result()
    except Exception as e:  # noqa: BLE001 (named in the one line)
        raise store_failed(e, path) from e


def store_failed(e: BaseException, path: str) -> OutputError:
    """The run's one line for a store whose write failed with ``e``; what was written is removed."""
    remove_output(path)
    os_error = _os_error(e)
    said = f"[Errno {os_error.errno}] {os_error.strerror}" if os_error else f"{type(e).__name__}: {_first_line(e)}"
    return OutputError(f"output: writing {path} failed: {said}; the partial store was removed",
                       exit_code=2 if os_error is not None and os_error.errno in USERS_TO_FIX else 1)


def _os_error(e: BaseException) -> OSError | None:
    """The OS error under ``e`` (``[Errno 28] No space left on device``), if any."""
    seen = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_stored(client, built, value, path: str) -> dict:
    """Read the store back on the workers and compare its float64 checksum with the one of
    the computed result: a store that holds other values (chunks lost, zeros) fails the
    run with :class:`OutputError`, and is removed."""
    import numpy as np

    from spillway.workflows.zarr.read import open_array

    summary = built.summarize(value)
    expected = summary.get("checksum")
    stored = open_array(path, "numpy")
    complex_result = np.issubdtype(stored.dtype, np.complexfloating)
    acc = np.complex128 if complex_result else np.float64
    sums = client.compute([stored.sum(dtype=acc), abs(stored).sum(dtype=np.float64)])
    total, scale = client.gather([on_host(client, f) for f in sums])
    total = complex(total) if complex_result else float(total)
    want = complex(*expected) if isinstance(expected, list) else expected
    # the sums differ only by the order of additions
    ok = want is not None and abs(total - want) <= 1e-9 * max(float(scale), 1.0)
    if not ok:
        remove_output(path)
        raise OutputError(f"output: {path} reads back a checksum of {total!r}, not the result's {want!r}; "
                          "the store was removed")
    return {"ok": True, "checksum": [total.real, total.imag] if complex_result else total}
