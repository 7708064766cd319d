"""The host-decode pool of Zarr default stores (zstd, one frame per chunk), on CPU: its
buffers stay within their budget and are reused, chunks decode to zarr's bits, and a read
task on a dask worker secedes, so one worker with one thread has several reads in flight."""

from __future__ import annotations

import threading
import time

import numpy as np
import dask.config
import pytest

from spillway.workflows.zarr import host_decode, read
from spillway.workflows.zarr.chunk_files import ZSTD, chunk_files_of
from spillway.workflows.zarr.fallback import Fallback


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setitem(dask.config.config["spillway"], "zarr-decode-threads", 4)
    monkeypatch.setitem(dask.config.config["spillway"], "zarr-decode-buffer-bytes", 64 * 2**20)
    host_decode.close()
    yield host_decode.decoder()
    host_decode.close()


U = 2**16  # the smallest size class


def test_reads_wait_for_room_and_buffers_are_reused():
    buffers = host_decode.BufferSet(10 * U)
    buffers.reserve(6 * U)
    a = buffers.take(6 * U)
    got = []

    def second_read():
        buffers.reserve(6 * U)
        got.append(buffers.take(6 * U - 100))  # a file a little smaller: the same size class

    t = threading.Thread(target=second_read)
    t.start()
    time.sleep(0.1)
    assert not got  # 12 U would pass the budget while the first read holds 6 U
    buffers.give(a)
    buffers.unreserve(6 * U)
    t.join(2)
    assert got and got[0].nbytes == 6 * U - 100 and got[0].ctypes.data == a.ctypes.data  # reused
    assert buffers.counts()["allocated"] == 6 * U and buffers.counts()["peak"] == 6 * U
    buffers.give(got[0])
    buffers.unreserve(6 * U)
    buffers.reserve(50 * U)  # larger than the budget: one read alone still proceeds
    big = buffers.take(50 * U)
    assert big.nbytes == 50 * U and buffers.counts()["kept"] == 0  # the kept 6 U were dropped for it
    buffers.give(big)
    buffers.unreserve(50 * U)
    assert buffers.held == 0 and buffers.reserved == 0  # not kept: over the budget
    assert buffers.release_kept() == 0


def test_size_classes():
    assert host_decode.size_class(1) == U
    assert host_decode.size_class(1_500_000_000) == 12 * 2**27  # twelve sixteenths of 2 GiB
    assert all(host_decode.size_class(n) >= n for n in (U + 1, 10**6, 7 * 10**8, 2**31))
    assert host_decode.size_class(7 * 10**8) == host_decode.size_class(6.9e8.__int__())


def test_default_store_chunks_decode_in_the_pool_to_zarrs_bits(pool, tmp_path):
    import zarr

    data = np.round(250 + 10 * np.random.default_rng(0).standard_normal((30, 40, 50)), 2).astype(np.float32)
    z = zarr.create_array(str(tmp_path / "d.zarr"), shape=data.shape, chunks=(8, 40, 50), dtype="float32")
    z[...] = data
    files = chunk_files_of(z)
    assert files.encoding == ZSTD and not files.gpu_decodes()
    for i, start in enumerate(range(0, 30, 8)):
        shape = (min(8, 30 - start), 40, 50)
        got = host_decode.read_in_pool(lambda io: read.read_direct(files, (i, 0, 0), shape, io),
                                       need=host_decode.bytes_to_read(files, (i, 0, 0)), to_device=False)
        assert got.tobytes() == data[start:start + 8].tobytes()
    counts = host_decode.buffer_counts()
    assert counts["in_use"] == 0 and counts["kept"] > 0 and counts["threads"] == 4


def test_a_corrupt_frame_is_a_fallback_not_a_crash(pool, tmp_path):
    import zarr

    z = zarr.create_array(str(tmp_path / "d.zarr"), shape=(16, 64), chunks=(8, 64), dtype="float32")
    z[...] = np.arange(16 * 64, dtype=np.float32).reshape(16, 64)
    files = chunk_files_of(z)
    path = files.chunk_path((1, 0))
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) // 2:] = b"\x00" * (len(raw) - len(raw) // 2)
    open(path, "wb").write(bytes(raw))
    with pytest.raises(Fallback, match="zstd"):
        host_decode.read_in_pool(lambda io: read.read_direct(files, (1, 0), (8, 64), io), to_device=False)
    assert host_decode.buffer_counts()["in_use"] == 0


_lock = threading.Lock()
_in_flight = {"now": 0, "most": 0}


def _slow_read(io):
    with _lock:
        _in_flight["now"] += 1
        _in_flight["most"] = max(_in_flight["most"], _in_flight["now"])
    time.sleep(0.4)
    with _lock:
        _in_flight["now"] -= 1
    return np.zeros(4, np.uint8)


def _read_task(i):
    return int(host_decode.read_in_pool(_slow_read, to_device=False).sum()) + i


def test_read_tasks_secede_so_one_worker_thread_has_several_reads_in_flight(pool):
    from distributed import Client, LocalCluster

    _in_flight.update(now=0, most=0)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        assert client.gather(client.map(_read_task, range(8), pure=False)) == list(range(8))
    # one task thread, several reads at once (the reads overlap: what a wall time would show)
    assert _in_flight["most"] >= 3, _in_flight
    assert host_decode.buffer_counts()["reads_in_flight_peak"] >= 3


def test_buffers_for_the_device_come_from_the_stores_arena_while_it_has_room():
    from spillway.memory.arena import Arena
    from spillway.memory.host import HostBuffers

    host = HostBuffers(Arena(np.empty(2**20, dtype=np.uint8)))
    buffers = host_decode.BufferSet(2**22, pinned=host)
    a = buffers.take(600_000, pinned=True)
    assert host.arena.owns(a) and host.arena.used_bytes >= 600_000  # the store counts it
    c = buffers.take(1000)  # a file's bytes: never the arena
    assert not host.wanted.is_set()
    b = buffers.take(600_000, pinned=True)  # the arena is full: an ordinary buffer
    assert host.wanted.is_set()  # and the arena's growth pins its segments without waiting
    assert not host.arena.owns(b) and not host.arena.owns(c)
    assert buffers.counts()["arena_taken"] == 600_000 and buffers.in_use == 600_000 + 10 * U + U
    for buffer in (a, b, c):
        buffers.give(buffer)
    assert host.arena.used_bytes == 0 and buffers.in_use == 0
    assert buffers.kept == 10 * U + U  # the arena slice went back to the store, not kept here


def test_reads_for_the_device_before_the_arena_is_in_want_it_pinned():
    from spillway.memory.host import HostBuffers

    host = HostBuffers(None)  # its arena still growing: no segment pinned yet
    buffers = host_decode.BufferSet(2**22, pinned=host)
    buffers.give(buffers.take(1000))
    assert not host.wanted.is_set()
    buffers.give(buffers.take(1000, pinned=True))
    assert host.wanted.is_set()


def test_a_budget_of_about_one_read_serialises_the_reads_without_deadlock(monkeypatch, tmp_path):
    import zarr

    data = np.round(np.random.default_rng(1).standard_normal((48, 64, 64)), 2).astype(np.float32)
    z = zarr.create_array(str(tmp_path / "d.zarr"), shape=data.shape, chunks=(8, 64, 64), dtype="float32")
    z[...] = data
    files = chunk_files_of(z)
    monkeypatch.setitem(dask.config.config["spillway"], "zarr-decode-threads", 4)
    monkeypatch.setitem(dask.config.config["spillway"], "zarr-decode-buffer-bytes", int(1.5 * files.chunk_bytes))
    host_decode.close()
    try:
        pool = host_decode.decoder()
        futures = [pool.submit(lambda io, i=i: read.read_direct(files, (i, 0, 0), files.chunk_shape, io), False,
                               host_decode.bytes_to_read(files, (i, 0, 0))) for i in range(6)]
        for i, f in enumerate(futures):
            assert f.result(timeout=20).tobytes() == data[8 * i:8 * i + 8].tobytes()
        assert pool.buffers.peak <= 2 * files.chunk_bytes  # one read's file and chunk at a time
    finally:
        host_decode.close()
