"""One zstd frame decoded while its file is read, in pieces: the read, the decode and the
copy to the device of one chunk overlap (the default store's chunk is one frame of 1.5
GB, which no decoder splits over threads).

Why pieces: the whole-chunk path reads the file whole, then decodes it whole into a host
buffer of the chunk's size, then copies that to the device. Cold, the read and the decode
add up; cached, the decoder writes 1.5 GB of output through memory, never cache. Here the
file is read a piece at a time into two reused buffers, a reader thread reading the next
piece while this thread decodes the one before (so cold, the disk works during the
decode; the kernel's ``POSIX_FADV_WILLNEED`` gave no overlap on a VM's disk: the advice
itself took the read's time); python-zstandard's streaming decompressor (libzstd's ``ZSTD_decompressStream``,
GIL released) decodes into one of two small staging buffers, and each decoded piece is
copied to the device on the thread's own stream while the next piece decodes into the
other buffer. The host holds a few pieces per read instead of the file and the chunk.

The decoded bytes are bit for bit numcodecs' (both are libzstd). Where ``zstandard`` is
not installed the pool keeps the whole-chunk path (:func:`available` logs it once)."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .counters import count, count_stage
from .fallback import Fallback, note
from .zstd import HEAD_BYTES, check_zstd_headers

#: threads that read files' next pieces while the pool's threads decode (one read in
#: flight per decoding thread)
READERS = 16
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
    """The ``zarr-decode-piece-bytes`` option as this worker was given it."""
    from spillway.options.settings import worker_value

    return worker_value("zarr_decode_piece_bytes")


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
    """The host bytes a streamed read holds: its two file buffers, its two staging buffers and
    the decoder's window (libzstd's streaming decoder keeps that much of the output: 2-8
    MiB at zarr's levels for a large chunk, the whole chunk for a chunk smaller than it)."""
    piece = piece or piece_bytes()
    return 2 * min(piece, max(1, file_bytes)) + 2 * min(piece, chunk_bytes) + min(window or chunk_bytes, chunk_bytes)


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
    """The file as zstandard's stream reader reads it, a piece at a time into two reused
    buffers: while zstandard decodes one piece, a reader thread ``pread``s the next into the
    other buffer (so cold, the disk works while this thread decodes). ``read`` returns a
    view of the piece read ahead and starts the read of the one after it into the buffer
    zstandard just finished with (it asks for more input only once it has consumed all it
    was given). ``seconds`` are the reader's (the read stage's), ``waited`` the decoding
    thread's time waiting for a piece."""

    def __init__(self, path: str, size: int, buffers):
        self.size = size
        self.buffers = buffers
        self.pos = 0  # the file's bytes handed to the reader so far
        self.seconds = 0.0
        self.waited = 0.0
        self._next = 0  # the buffer the next read goes into
        self._pending = None  # the first piece, held for the header check
        self._ahead = None  # the read of the next piece, in flight
        self._fd = os.open(path, os.O_RDONLY)
        if hasattr(os, "posix_fadvise"):  # a whole file, front to back: the kernel reads ahead far
            os.posix_fadvise(self._fd, 0, size, os.POSIX_FADV_SEQUENTIAL)

    def close(self) -> None:
        """Wait for the read in flight (its buffer goes back to the set after this)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            try:
                ahead.result()
            except BaseException:  # noqa: BLE001 - the decode's own error is the one raised
                pass
        os.close(self._fd)

    def first(self) -> memoryview:
        """The first piece, read before the decoder starts (its header is checked first);
        the read of the second starts meanwhile."""
        self._pending = self._pread(*self._claim())
        self._start_next()
        return self._pending

    def read(self, n: int = -1) -> memoryview:
        if self._pending is not None:
            piece, self._pending = self._pending, None
            return piece
        if self._ahead is None:
            return memoryview(b"")
        start = time.perf_counter()
        ahead, self._ahead = self._ahead, None
        piece = ahead.result()
        self.waited += time.perf_counter() - start
        self._start_next()
        return piece

    def _claim(self) -> tuple[int, int, int]:
        """The next piece: its buffer, offset and length (length 0 at the end)."""
        slot, offset = self._next, self.pos
        n = max(0, min(len(self.buffers[slot]), self.size - offset))
        self._next ^= 1
        self.pos += n
        return slot, offset, n

    def _start_next(self) -> None:
        slot, offset, n = self._claim()
        self._ahead = _reader().submit(self._pread, slot, offset, n) if n else None

    def _pread(self, slot: int, offset: int, n: int) -> memoryview:
        start = time.perf_counter()
        view = memoryview(self.buffers[slot])[:n]
        got = 0
        while got < n:
            more = os.preadv(self._fd, [view[got:]], offset + got)
            if more <= 0:
                raise Fallback(f"read {offset + got} of {self.size} bytes")
            got += more
        self.seconds += time.perf_counter() - start  # one reader per source at a time
        return view


_readers: ThreadPoolExecutor | None = None
_readers_lock = threading.Lock()


def _reader() -> ThreadPoolExecutor:
    """This process's reader threads, one per decoding thread at most (each source has one
    read in flight)."""
    global _readers
    with _readers_lock:
        if _readers is None:
            _readers = ThreadPoolExecutor(READERS, thread_name_prefix="spillway-zarr-read")
        return _readers


def close() -> None:
    """Stop the reader threads (the pool's teardown)."""
    global _readers
    with _readers_lock:
        readers, _readers = _readers, None
    if readers is not None:
        readers.shutdown(wait=True)


def decode_file(path: str, size: int, nbytes: int, io, sink, piece: int | None = None):
    """The chunk file at ``path`` (``size`` bytes, one zstd frame of ``nbytes``) decoded
    into ``sink`` piece by piece, through buffers of ``io`` (a
    :class:`~.host_io.HostIO`): returns ``sink.finish()``. A file that is not one frame
    of ``nbytes`` (truncated, corrupt, another size) raises :class:`Fallback` in one line."""
    import zstandard

    piece = piece or piece_bytes()
    source = _FileSource(path, size, [io.empty(min(piece, max(1, size)), pinned=False) for _ in range(2)])
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
            source, read_size=len(source.buffers[0]), read_across_frames=False, closefd=False)
        offset = slot = 0
        decode_s = 0.0
        while offset < nbytes:
            sink.wait(slot)  # the copy out of this staging buffer has finished
            view = memoryview(staging[slot])[:min(piece, nbytes - offset)]
            start, waited_before = time.perf_counter(), source.waited
            got = read_into(reader, view)
            decode_s += time.perf_counter() - start - (source.waited - waited_before)
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


def read_into(reader, view: memoryview) -> int:
    """Decode into all of ``view`` (fewer bytes only where the frame ends first)."""
    got = 0
    while got < len(view):
        n = reader.readinto(view[got:])
        if not n:
            break
        got += n
    return got
