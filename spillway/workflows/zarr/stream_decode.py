"""One zstd frame decoded while its file is read, in pieces: the read, the decode and the
copy to the device of one chunk overlap (the default store's chunk is one frame of 1.5
GB, which no decoder splits over threads).

Why pieces: the whole-chunk path reads the file whole, then decodes it whole into a host
buffer of the chunk's size, then copies that to the device. Cold, the read and the decode
add up; cached, the decoder writes 1.5 GB of output through memory, never cache. Here the
file is read a piece at a time into one reused buffer, with the kernel asked to fetch the
next pieces meanwhile (``POSIX_FADV_WILLNEED``: the disk reads ahead while this thread
decodes); python-zstandard's streaming decompressor (libzstd's ``ZSTD_decompressStream``,
GIL released) decodes into one of two small staging buffers, and each decoded piece is
copied to the device on the thread's own stream while the next piece decodes into the
other buffer. The host holds a few pieces per read instead of the file and the chunk.

The decoded bytes are bit for bit numcodecs' (both are libzstd). Where ``zstandard`` is
not installed the pool keeps the whole-chunk path (:func:`available` logs it once)."""

from __future__ import annotations

import os
import time

from .counters import count, count_stage
from .fallback import Fallback, note
from .zstd import HEAD_BYTES, check_zstd_headers

#: bytes of a piece: the file is read, and the chunk decoded and copied, this many bytes at a
#: time (benchmarks/NOTES.md, issue 29: the figures it was chosen from)
PIECE_BYTES = 16 * 2**20
#: pieces of the file the kernel is asked to read ahead of the one being decoded
READ_AHEAD_PIECES = 8
#: the largest zstd window accepted (libzstd's streaming decoder holds one window of output;
#: zarr's levels use 2-8 MiB; larger only from --long or --ultra writers)
MAX_WINDOW = 2**31


def available() -> bool:
    """Whether python-zstandard is installed (else the pool decodes whole chunks, and says
    so once in the worker's log)."""
    try:
        import zstandard  # noqa: F401
    except ImportError:
        note("no zstandard", "python-zstandard is not installed: default-store chunks are read whole, then "
             "decoded whole by numcodecs (install spillway[cuda13] or [cuda12] to decode while reading)")
        return False
    return True


def piece_bytes() -> int:
    env = os.environ.get("SPILLWAY_ZARR_DECODE_PIECE_BYTES")
    return max(2**16, int(env)) if env else PIECE_BYTES


def window_of(path: str) -> int | None:
    """The window a chunk file's zstd frame states (the output its streaming decoder holds),
    from its first bytes; None where they do not start a frame (the read then says why)."""
    import zstandard

    try:
        with open(path, "rb", buffering=0) as f:
            return zstandard.get_frame_parameters(f.read(HEAD_BYTES)).window_size
    except (OSError, zstandard.ZstdError):
        return None


def need(file_bytes: int, chunk_bytes: int, window: int, piece: int | None = None) -> int:
    """The host bytes a streamed read holds: its file buffer, its two staging buffers and
    the decoder's window (libzstd's streaming decoder keeps that much of the output: 2-8
    MiB at zarr's levels for a large chunk, the whole chunk for a chunk smaller than it)."""
    piece = piece or piece_bytes()
    return min(piece, max(1, file_bytes)) + 2 * min(piece, chunk_bytes) + min(window or chunk_bytes, chunk_bytes)


class HostSink:
    """Decoded pieces into a host array (CPU, and the tests of this module)."""

    def __init__(self, out):
        self.out = out

    def wait(self, slot: int) -> None:
        """Return once the staging buffer ``slot`` may be written again."""

    def put(self, slot: int, offset: int, piece) -> None:
        self.out[offset:offset + len(piece)] = piece

    def finish(self):
        return self.out

    def abandon(self) -> None:
        """A failed decode: nothing may read the staging buffers after this returns."""


class _FileSource:
    """The file as zstandard's stream reader reads it: each ``read`` fills the one reused
    buffer with the next piece (``pread``) and returns a view of it (zstandard has consumed
    the previous piece when it asks for the next), after asking the kernel for the pieces
    ahead. Its seconds are the read stage's."""

    def __init__(self, path: str, size: int, buffer):
        self.size = size
        self.buffer = buffer
        self.pos = 0
        self.seconds = 0.0
        self._pending = None
        self._advised = 0  # the file's bytes up to here were asked for (POSIX_FADV_WILLNEED)
        self._fd = os.open(path, os.O_RDONLY)
        self._advise = hasattr(os, "posix_fadvise")
        if self._advise:
            os.posix_fadvise(self._fd, 0, size, os.POSIX_FADV_SEQUENTIAL)

    def close(self) -> None:
        os.close(self._fd)

    def first(self) -> memoryview:
        """The first piece, read before the decoder starts (its header is checked first)."""
        self._pending = self._fill()
        return self._pending

    def read(self, n: int = -1) -> memoryview:
        if self._pending is not None:
            piece, self._pending = self._pending, None
            return piece
        return self._fill()

    def _fill(self) -> memoryview:
        start = time.perf_counter()
        n = min(len(self.buffer), self.size - self.pos)
        if n <= 0:
            return memoryview(b"")
        # the disk reads the next pieces while this one decodes; each call asks only for the
        # bytes not asked for before (the kernel looks up every page of the range it is given)
        ahead = max(self.pos + n, self._advised)
        end = min(self.size, self.pos + n + READ_AHEAD_PIECES * len(self.buffer))
        if self._advise and ahead < end:
            os.posix_fadvise(self._fd, ahead, end - ahead, os.POSIX_FADV_WILLNEED)
            self._advised = end
        view = memoryview(self.buffer)[:n]
        got = 0
        while got < n:
            more = os.preadv(self._fd, [view[got:]], self.pos + got)
            if more <= 0:
                raise Fallback(f"read {self.pos + got} of {self.size} bytes")
            got += more
        self.pos += n
        self.seconds += time.perf_counter() - start
        return view


def decode_file(path: str, size: int, nbytes: int, io, sink, piece: int | None = None):
    """The chunk file at ``path`` (``size`` bytes, one zstd frame of ``nbytes``) decoded
    into ``sink`` piece by piece, through buffers of ``io`` (a
    :class:`~.host_io.HostIO`): returns ``sink.finish()``. A file that is not one frame
    of ``nbytes`` (truncated, corrupt, another size) raises :class:`Fallback` in one line."""
    import zstandard

    piece = piece or piece_bytes()
    source = _FileSource(path, size, io.empty(min(piece, max(1, size)), pinned=False))
    held = 0
    done = False
    try:
        head = bytes(source.first()[:HEAD_BYTES])
        check_zstd_headers([head], [nbytes])
        try:
            window = zstandard.get_frame_parameters(head).window_size
        except zstandard.ZstdError as e:
            raise Fallback(f"zstd could not read the frame header ({e})") from None
        held = min(window or nbytes, nbytes)  # libzstd's streaming decoder holds a window of output
        if io.buffers is not None:
            io.buffers.hold(held)
        staging = [io.empty(min(piece, nbytes), pinned=True) for _ in range(2)]
        reader = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).stream_reader(
            source, read_size=len(source.buffer), read_across_frames=False, closefd=False)
        offset = slot = 0
        decode_s = 0.0
        while offset < nbytes:
            sink.wait(slot)  # the copy out of this staging buffer has finished
            view = memoryview(staging[slot])[:min(piece, nbytes - offset)]
            start, read_before = time.perf_counter(), source.seconds
            got = _read_into(reader, view)
            decode_s += time.perf_counter() - start - (source.seconds - read_before)
            if got < len(view):
                raise Fallback(f"the zstd frame ended after {offset + got} of {nbytes} bytes "
                               f"(file of {size} bytes, truncated?)")
            sink.put(slot, offset, view)
            offset += len(view)
            slot ^= 1
        if reader.read(1):
            raise Fallback(f"the zstd frame decodes to more than {nbytes} bytes")
        out = sink.finish()
        done = True
    except zstandard.ZstdError as e:
        raise Fallback(f"zstd could not decode a frame (ZstdError: {e})") from None
    finally:
        if not done:
            sink.abandon()
        source.close()
        if held and io.buffers is not None:
            io.buffers.unhold(held)
    count_stage("read", size, source.seconds)
    count("host", nbytes, 1, decode_s)
    count_stage("decode", nbytes, decode_s)
    return out


def _read_into(reader, view: memoryview) -> int:
    """Decode into all of ``view`` (fewer bytes only where the frame ends first)."""
    got = 0
    while got < len(view):
        n = reader.readinto(view[got:])
        if not n:
            break
        got += n
    return got
