"""A chunk of one zstd frame decoded while read, in pieces (the default store's path to the
device), on CPU: numcodecs' bytes bit for bit whatever the piece size, a truncated or
corrupt file is a one-line Fallback, the buffers held stay within what the read
reserved, and the pool streams chunks going to the device (a host array stands for the
device here; the copy itself is tested on the GPU host)."""

from __future__ import annotations

import logging
import os

import numpy as np
import dask.config
import pytest

from spillway.options.settings import DECLARED

pytest.importorskip("zstandard")

from spillway_bench.zarr.defaults import field_block, random_block  # noqa: E402
from spillway.workflows.zarr import host_decode, read, stream_decode  # noqa: E402
from spillway.workflows.zarr.chunk_files import ZSTD, chunk_files_of  # noqa: E402
from spillway.workflows.zarr.fallback import Fallback  # noqa: E402
from spillway.workflows.zarr.host_io import HostIO  # noqa: E402


def _frame_file(tmp_path, data: np.ndarray, level: int = 0):
    import numcodecs

    frame = numcodecs.Zstd(level=level).encode(data)
    path = tmp_path / f"c-{data.nbytes}-{level}"
    path.write_bytes(frame)
    return str(path), len(frame), numcodecs.Zstd().decode(frame)


def _streamed(path, size, nbytes, piece, buffers=None):
    io = HostIO(buffers)
    try:
        return stream_decode.decode_file(path, size, nbytes, io, stream_decode.HostSink(np.empty(nbytes, np.uint8)),
                                         piece)
    finally:
        if buffers is not None:
            io.give_back()


@pytest.mark.parametrize("make", [field_block, random_block], ids=["field", "random"])
def test_streamed_decode_is_numcodecs_bit_for_bit_for_any_piece_size(tmp_path, make):
    data = make(0, 7, 91, 183)  # 466 284 bytes: no piece size below divides it
    for level in (0, 9):
        path, size, expected = _frame_file(tmp_path, data, level)
        assert bytes(expected) == data.tobytes()
        for piece in (4096, 65_537, 2**17, 2**20):  # smaller than the file, not a divisor, larger than all
            got = _streamed(path, size, data.nbytes, piece, host_decode.BufferSet(2**24))
            assert got.tobytes() == bytes(expected), (level, piece)


def test_odd_sized_chunks_and_a_single_byte_chunk(tmp_path):
    rng = np.random.default_rng(3)
    for n in (1, 4095, 4097, 3 * 4096 + 1):
        data = np.round(rng.standard_normal(n), 1).astype(np.float32).view(np.uint8)[:n].copy()
        path, size, expected = _frame_file(tmp_path, data)
        assert _streamed(path, size, n, 4096).tobytes() == bytes(expected)


def test_a_truncated_file_is_a_one_line_fallback(tmp_path):
    data = field_block(0, 4, 91, 183)
    path, size, _ = _frame_file(tmp_path, data)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    buffers = host_decode.BufferSet(2**24)
    with pytest.raises(Fallback, match=rf"ended after \d+ of {data.nbytes} bytes") as e:
        _streamed(path, size // 2, data.nbytes, 8192, buffers)
    assert "\n" not in str(e.value)
    assert buffers.in_use == 0  # every piece handed back, the decoder's window too


def test_a_corrupt_frame_or_another_size_is_a_one_line_fallback(tmp_path):
    data = field_block(0, 4, 91, 183)  # compressed blocks (random data's are stored raw: no check)
    path, size, _ = _frame_file(tmp_path, data)
    raw = bytearray(open(path, "rb").read())
    raw[size // 3:] = b"\xff" * (size - size // 3)
    open(path, "wb").write(bytes(raw))
    with pytest.raises(Fallback, match="zstd could not decode a frame") as e:
        _streamed(path, size, data.nbytes, 8192)
    assert "\n" not in str(e.value)
    path, size, _ = _frame_file(tmp_path, data)
    with pytest.raises(Fallback, match=f"states {data.nbytes} bytes, expected {data.nbytes - 4}"):
        _streamed(path, size, data.nbytes - 4, 8192)
    open(path, "wb").write(b"not zstd at all, twenty bytes or more")
    with pytest.raises(Fallback, match="not a zstd frame"):
        _streamed(path, 37, data.nbytes, 8192)


def test_a_file_shorter_than_its_size_is_a_one_line_fallback_and_the_reader_is_waited_for(tmp_path):
    data = field_block(0, 4, 91, 183)
    path, size, _ = _frame_file(tmp_path, data)
    with open(path, "r+b") as f:
        f.truncate(size - 1000)  # shrunk after its size was taken
    buffers = host_decode.BufferSet(2**24)
    with pytest.raises(Fallback, match=f"read {size - 1000} of {size} bytes"):
        _streamed(path, size, data.nbytes, 8192, buffers)
    assert buffers.in_use == 0


class _Watch(stream_decode.HostSink):
    """A host sink that notes the set's bytes in use at every piece."""

    def __init__(self, out, buffers):
        super().__init__(out)
        self.buffers = buffers
        self.in_use = []

    def put(self, slot, offset, piece):
        self.in_use.append(self.buffers.in_use)
        super().put(slot, offset, piece)


def test_buffers_held_are_a_few_pieces_and_the_window_within_what_the_read_reserved(tmp_path):
    data = field_block(0, 60, 181, 183)  # 8 MB decoded: larger than zstd's window at level 0
    path, size, expected = _frame_file(tmp_path, data)
    window = stream_decode.window_of(path)
    assert window == 2**21 < data.nbytes
    piece = 2**16
    need = stream_decode.need(size, data.nbytes, window, piece)
    assert need == 4 * piece + window
    buffers = host_decode.BufferSet(need)
    buffers.reserve(need)
    sink = _Watch(np.empty(data.nbytes, np.uint8), buffers)
    io = HostIO(buffers)
    got = stream_decode.decode_file(path, size, data.nbytes, io, sink, piece)
    io.give_back()
    buffers.unreserve(need)
    assert got.tobytes() == bytes(expected)
    assert len(sink.in_use) == -(-data.nbytes // piece)  # one put per piece
    # two pieces of the file, two staging pieces and the decoder's window: never the chunk
    assert set(sink.in_use) == {need}
    assert buffers.peak == need < data.nbytes
    assert buffers.in_use == 0 and buffers.kept == 4 * piece  # kept for the next read
    small = field_block(0, 2, 91, 183)  # smaller than a window: the decoder holds the chunk
    path, size, _ = _frame_file(tmp_path, small)
    assert stream_decode.need(size, small.nbytes, stream_decode.window_of(path), piece) == \
        2 * min(piece, size) + 2 * piece + small.nbytes


@pytest.fixture
def streaming_pool(monkeypatch):
    """The pool with its device sink replaced by a host array (as ``DeviceSink`` fills its
    device buffer)."""
    monkeypatch.setitem(dask.config.config["spillway"], "zarr-decode-threads", 3)
    monkeypatch.setitem(dask.config.config["spillway"], "zarr-decode-buffer-bytes", 3 * 2**20)
    monkeypatch.setitem(dask.config.config["spillway"], "zarr-decode-piece-bytes", 2**16)
    monkeypatch.setattr(host_decode.HostDecoder, "_device_sink",
                        lambda self, nbytes: stream_decode.HostSink(np.empty(nbytes, np.uint8)))
    host_decode.close()
    yield host_decode.decoder()
    host_decode.close()


def test_the_pool_streams_chunks_going_to_the_device_within_its_budget(streaming_pool, tmp_path):
    import zarr

    from spillway.workflows.zarr.decoded import decode_counters

    data = field_block(0, 100, 181, 183)  # chunks of 30 days, 4 MB; the last one of 10 days is cut
    z = zarr.create_array(str(tmp_path / "d.zarr"), shape=data.shape, chunks=(30, 181, 183), dtype="float32")
    z[...] = data
    files = chunk_files_of(z)
    assert files.encoding == ZSTD and streaming_pool.streams
    needs = [host_decode.bytes_to_read(files, (i, 0, 0), to_device=True) for i in range(4)]
    assert all(n <= 4 * 2**16 + 2**21 for n in needs)  # pieces and a window of 2 MiB, not the chunk
    assert streaming_pool.buffers.budget < 2 * needs[0] and needs[0] < files.chunk_bytes
    before = decode_counters()["stages"]
    def chunk(i):
        return lambda io: read.read_direct(files, (i, 0, 0), (min(30, 100 - 30 * i), 181, 183), io)

    futures = [streaming_pool.submit(chunk(i), True, needs[i]) for i in range(4)]
    for i, f in enumerate(futures):
        assert f.result(timeout=60).tobytes() == data[30 * i:30 * i + 30].tobytes()
    after = decode_counters()
    assert after["stages"]["decode"]["bytes"] - before["decode"]["bytes"] == 4 * files.chunk_bytes
    assert after["stages"]["read"]["bytes"] - before["read"]["bytes"] == sum(
        os.path.getsize(files.chunk_path((i, 0, 0))) for i in range(4))
    counts = after["host_buffers"]
    # a budget of under two reads: one read at a time, holding its pieces and window only
    assert counts["in_use"] == 0 and counts["peak"] <= needs[0] <= streaming_pool.buffers.budget


def test_without_zstandard_the_pool_decodes_whole_chunks_and_says_so_once(monkeypatch, caplog, tmp_path):
    import sys

    import zarr

    from spillway.workflows.zarr import fallback

    monkeypatch.setitem(sys.modules, "zstandard", None)  # import fails
    monkeypatch.setattr(fallback, "_noted", set())
    monkeypatch.setitem(dask.config.config["spillway"], "zarr-decode-threads", 2)
    host_decode.close()
    try:
        with caplog.at_level(logging.WARNING, logger="spillway.workflows.zarr"):
            pool = host_decode.decoder()
            assert not pool.streams and not stream_decode.available()
        assert [r.getMessage().count("python-zstandard is not installed") for r in caplog.records] == [1]
        data = field_block(0, 9, 91, 183)
        z = zarr.create_array(str(tmp_path / "d.zarr"), shape=data.shape, chunks=(9, 91, 183), dtype="float32")
        z[...] = data
        files = chunk_files_of(z)
        assert host_decode.bytes_to_read(files, (0, 0, 0), to_device=True) > files.chunk_bytes  # file + chunk
        got = host_decode.read_in_pool(lambda io: read.read_direct(files, (0, 0, 0), data.shape, io), to_device=False)
        assert got.tobytes() == data.tobytes()
    finally:
        host_decode.close()


def test_the_worker_description_says_the_piece_size(monkeypatch):
    from spillway.workflows.zarr import device_io

    monkeypatch.setattr(device_io, "kvikio_available", lambda: False)
    assert device_io.describe()["zstd_stream_piece_bytes"] == DECLARED["zarr_decode_piece_bytes"].default == 16 * 2**20
    monkeypatch.setitem(dask.config.config["spillway"], "zarr-decode-piece-bytes", 2**24)
    assert device_io.describe()["zstd_stream_piece_bytes"] == 2**24


class _Stream:
    """Stands for a CUDA stream: notes what is queued and waited for."""

    def __init__(self):
        self.log = []
        self.events = 0

    def wait_event(self, event):
        self.log.append(("after default stream", event))

    def record(self):
        self.events += 1
        return _Event(self.log, self.events)

    def synchronize(self):
        self.log.append(("stream synchronized",))


class _Event:
    def __init__(self, log, n):
        self.log, self.n = log, n

    def synchronize(self):
        self.log.append(("waited for copy", self.n))


class _DeviceArray(np.ndarray):
    stream = None

    def set(self, host, stream=None):
        assert isinstance(host, np.ndarray) and host.flags.c_contiguous and stream is _DeviceArray.stream
        stream.log.append(("copy", int(host.nbytes)))
        self[...] = host


def test_device_sink_copies_each_piece_and_reuses_a_staging_buffer_only_after_its_copy(monkeypatch, tmp_path):
    """``DeviceSink`` with CuPy replaced by a recorder: piece k is copied as soon as it is
    decoded, the decoder waits for the copy of piece k before it writes piece k + 2 into
    the same staging buffer, and the stream is synchronized before the buffers go back."""
    import sys
    import types

    stream = _Stream()
    _DeviceArray.stream = stream
    fake = types.SimpleNamespace(empty=lambda n, dtype: np.empty(n, dtype).view(_DeviceArray), uint8=np.uint8,
                                 cuda=types.SimpleNamespace(Stream=types.SimpleNamespace(
                                     null=types.SimpleNamespace(record=lambda: "default stream's work"))))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    data = field_block(0, 5, 91, 183)
    path, size, expected = _frame_file(tmp_path, data)
    piece = 2**16
    io = HostIO(host_decode.BufferSet(2**24))
    out = stream_decode.decode_file(path, size, data.nbytes, io, host_decode.DeviceSink(data.nbytes, stream), piece)
    io.give_back()
    assert np.asarray(out).tobytes() == bytes(expected)
    pieces = -(-data.nbytes // piece)
    log = stream.log
    assert log[0] == ("after default stream", "default stream's work") and log[-1] == ("stream synchronized",)
    copies = [i for i, e in enumerate(log) if e[0] == "copy"]
    assert len(copies) == pieces and sum(log[i][1] for i in copies) == data.nbytes
    for k in range(2, pieces):  # before piece k is written into its buffer, piece k - 2's copy finished
        waited = log.index(("waited for copy", k - 1))  # event n is the one recorded after copy n - 1
        assert copies[k - 1] < waited < copies[k]
