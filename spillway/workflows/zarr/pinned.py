"""Stores read through the directory that was checked, never through a link.

A path is a name, and a name can be pointed elsewhere between a check and a read: a
tenant of the shared service that replaces its input store (or a directory above it, or
one chunk file in it) with a link to another tenant's store after its job was checked
would otherwise have the workers read the other store. So an input is *pinned* once, when
it is checked: its path resolved (links followed, once) and the directory it names then
opened component by component with ``O_NOFOLLOW``, its device and inode kept
(:class:`Pin`). Every later read, on the client or a worker, opens the root again the
same way and refuses a directory that is not the pinned one (:func:`open_root`), then
opens each key below it relative to that directory, never following a link
(:func:`open_key`). A link met anywhere, a replaced root, a file that is not a regular
file, a chunk file with more than one hard link (``st_nlink`` > 1: its other name may be
in another tenant's store) or a file that is not the one looked at just before the open
(device and inode compared) fails the read in one line naming the store; nothing of what
the link points to is opened.

:class:`PinnedStore` is zarr's :class:`~zarr.storage.LocalStore` reading this way (the
CPU path and every read through zarr); the GPU path opens chunk files with
:func:`open_key` and hands KvikIO the open file (``/proc/self/fd/N``), not the name.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
from dataclasses import dataclass

from spillway.options.errors import ParamError

#: how a directory on the way down is opened: a handle to walk from, no read permission
#: needed (directories above a data directory are often search-only), no link followed
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: a file: no link followed, and a FIFO put in a store does not block the open
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class Pin:
    """A store directory as it was checked: its resolved path and its identity."""

    root: str
    device: int
    inode: int
    #: the parameter that named it, for messages
    name: str = "input"


class PinnedPath(str):
    """A store's path (a str, as parameters are) that carries the :class:`Pin` taken when
    it was checked, so that the graph built from it reads the directory checked."""

    pin: Pin

    def __new__(cls, pin: Pin):
        self = super().__new__(cls, pin.root)
        self.pin = pin
        return self

    def __reduce__(self):
        return (PinnedPath, (self.pin,))


def pin_store(path: str, name: str = "input") -> PinnedPath:
    """``path`` resolved and pinned (a :class:`PinnedPath`); ParamError where nothing is
    there or the path changed while it was resolved. A path already pinned stays as it is."""
    if isinstance(path, PinnedPath):
        return path
    root = os.path.realpath(os.path.expanduser(path))
    fd = _walk(root, name, missing=f"{path!r} does not exist (give random or the path of a Zarr v3 array)")
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return PinnedPath(Pin(root, st.st_dev, st.st_ino, name))


def pin_of(path: str, name: str = "input") -> Pin:
    return pin_store(path, name).pin


def open_root(pin: Pin) -> int:
    """A descriptor of the pinned directory, reached again by its resolved path without
    following a link; ParamError where a link or another directory is there now."""
    fd = _walk(pin.root, pin.name, missing=f"{pin.root!r} no longer exists (removed after the job was checked)")
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (pin.device, pin.inode):
        os.close(fd)
        raise ParamError(f"{pin.name}: {pin.root!r} is not the store that was checked (replaced since); "
                         "nothing of it was read")
    return fd


def open_key(pin: Pin, key: str, root_fd: int | None = None) -> int | None:
    """A read-only descriptor of the regular file ``key`` (``c/0/1``) of the pinned store,
    or None where there is none (zarr's missing chunk); each component opened relative to
    the one above it without following links. ParamError for a link or anything but a
    directory or a regular file on the way."""
    parts = [p for p in key.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise ParamError(f"{pin.name}: key {key!r} of {pin.root!r} is not a path inside the store")
    top = open_root(pin) if root_fd is None else root_fd
    here = top
    try:
        for part in parts[:-1]:
            try:
                below = os.open(part, _DIR_FLAGS, dir_fd=here)
            except OSError as e:
                if e.errno in (errno.ENOTDIR, errno.ELOOP) and _is_link(part, here):
                    raise _link(pin, key) from None
                if e.errno in (errno.ENOENT, errno.ENOTDIR):
                    return None
                raise
            if here != top:
                os.close(here)
            here = below
        try:
            checked = os.stat(parts[-1], dir_fd=here, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISLNK(checked.st_mode):
            raise _link(pin, key)
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=here)
        except (FileNotFoundError, IsADirectoryError):
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _link(pin, key) from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            if stat.S_ISDIR(st.st_mode):
                return None
            raise ParamError(f"{pin.name}: {key!r} in {pin.root!r} is not a regular file; not read")
        if (st.st_dev, st.st_ino) != (checked.st_dev, checked.st_ino):
            os.close(fd)
            raise ParamError(f"{pin.name}: {key!r} in {pin.root!r} is not the file that was checked (replaced "
                             "while it was opened); nothing of it was read")
        if st.st_nlink > 1:
            # a second name of the file may be anywhere on its file system, another tenant's
            # store among them: which name is the original is not known
            os.close(fd)
            raise ParamError(f"{pin.name}: {key!r} in {pin.root!r} has {st.st_nlink} hard links (at most 1); "
                             "nothing of it was read")
        return fd
    finally:
        if here != top:
            os.close(here)
        if root_fd is None:
            os.close(top)


def read_key(pin: Pin, key: str, byte_range=None) -> bytes | None:
    """The bytes of ``key`` (or of ``(start, stop)`` of it; a negative start counts from the
    end), read through :func:`open_key`; None where the key has no file."""
    fd = open_key(pin, key)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        start, stop = 0, size
        if byte_range is not None:
            start, stop = byte_range
            start = max(0, size + start) if start < 0 else min(start, size)
            stop = size if stop is None else min(stop, size)
        parts, at = [], start
        while at < stop:
            piece = os.pread(fd, stop - at, at)
            if not piece:
                break
            parts.append(piece)
            at += len(piece)
        return b"".join(parts)
    finally:
        os.close(fd)


def fd_path(fd: int) -> str:
    """A name of the open file ``fd`` that reaches that very file (Linux): what readers that
    take a path (KvikIO) are given instead of the chunk's name."""
    return f"/proc/self/fd/{fd}"


def _walk(path: str, name: str, *, missing: str) -> int:
    """A descriptor of directory ``path`` (absolute), opened from ``/`` one component at a
    time, no link followed."""
    here = os.open("/", _DIR_FLAGS)
    try:
        for part in [p for p in path.split("/") if p]:
            try:
                below = os.open(part, _DIR_FLAGS, dir_fd=here)
            except FileNotFoundError:
                raise ParamError(f"{name}: {missing}") from None
            except OSError as e:
                if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                if _is_link(part, here):
                    raise ParamError(f"{name}: {path!r} was changed to lead through a link after it was "
                                     "checked; nothing of it was read") from None
                raise ParamError(f"{name}: {path!r} is not a directory (give the path of a Zarr v3 array)") from None
            os.close(here)
            here = below
    except BaseException:
        os.close(here)
        raise
    return here


def _is_link(part: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(part, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _link(pin: Pin, key: str) -> ParamError:
    return ParamError(f"{pin.name}: {key!r} in {pin.root!r} is a link; a store is read without following "
                      "links, and nothing of it was read")


def _store_class():
    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
    from zarr.storage import LocalStore

    def _range(byte_range):
        if byte_range is None:
            return None
        if isinstance(byte_range, RangeByteRequest):
            return (byte_range.start, byte_range.end)
        if isinstance(byte_range, OffsetByteRequest):
            return (byte_range.offset, None)
        if isinstance(byte_range, SuffixByteRequest):
            return (-byte_range.suffix, None)
        raise TypeError(f"unexpected byte range {byte_range!r}")

    class PinnedStore(LocalStore):
        """zarr's LocalStore over a pinned store, read-only, every key read through
        :func:`read_key` (picklable: a worker that unpickles it pins nothing anew)."""

        supports_writes = False
        supports_deletes = False

        def __init__(self, pin: Pin, *, read_only: bool = True):
            super().__init__(pin.root, read_only=True)
            self.pin = pin

        def with_read_only(self, read_only: bool = True):
            return type(self)(self.pin)

        def __eq__(self, other):
            return isinstance(other, type(self)) and self.pin == other.pin

        def __hash__(self):
            return hash(self.pin)

        def __reduce__(self):
            return (pinned_store, (self.pin,))

        async def _open(self, *, mode=None):
            self._is_open = True

        def _ensure_open_sync(self):
            self._is_open = True

        def _buffer(self, key, prototype, byte_range):
            from zarr.core.buffer import default_buffer_prototype

            data = read_key(self.pin, key, _range(byte_range))
            return None if data is None else (prototype or default_buffer_prototype()).buffer.from_bytes(data)

        def get_sync(self, key, *, prototype=None, byte_range=None):
            return self._buffer(key, prototype, byte_range)

        async def get(self, key, prototype=None, byte_range=None):
            return await asyncio.to_thread(self._buffer, key, prototype, byte_range)

        async def get_partial_values(self, prototype, key_ranges):
            return list(await asyncio.gather(*(asyncio.to_thread(self._buffer, key, prototype, byte_range)
                                               for key, byte_range in key_ranges)))

        async def exists(self, key):
            def present():
                fd = open_key(self.pin, key)
                if fd is not None:
                    os.close(fd)
                return fd is not None

            return await asyncio.to_thread(present)

    PinnedStore.__module__, PinnedStore.__qualname__ = __name__, "PinnedStore"
    return PinnedStore


_classes: dict = {}


def pinned_store(pin: Pin):
    """zarr's store over ``pin`` (:class:`PinnedStore`; built on first use, so importing
    this module imports no zarr)."""
    if "store" not in _classes:
        _classes["store"] = _store_class()
    return _classes["store"](pin)


def open_pinned(pin: Pin):
    """The zarr array of the pinned store, read-only."""
    import zarr

    return zarr.open_array(store=pinned_store(pin), mode="r")
