"""The host tier's drain: values written below off the spills' path, the ones needed last
first, only while the host tier lacks room for the next spills; nothing lost on the way."""

from __future__ import annotations

import errno
import threading
import time

import numpy as np
import pytest
from numpy_codec import NumpyCodec

from spillway.memory import store as store_module
from spillway.memory.codecs import HostCopy
from spillway.memory.host import HostBuffers
from spillway.memory.store import TieredStore

MB = 2**20


def chunk(i: int) -> np.ndarray:
    return np.random.default_rng(i).standard_normal(MB // 8)  # 1 MiB float64


class SlowTier:
    """A segment tier in a dict whose puts take ``delay`` seconds (a disk) and fail with
    ENOSPC while ``full``; it fails the test on a put over a key it holds."""

    name = "disk"
    where = "the test's disk"
    limit = None

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.full = False
        self.writing = threading.Event()
        self.held: dict = {}
        self.nbytes = 0
        self.calls = {"put": 0}
        self._lock = threading.Lock()

    def room(self):
        return None

    def rates(self) -> dict:
        return {"write": 0.0, "read": 0.0, "write_from": None, "read_from": None}

    def put(self, key, copy, itemsize: int = 8) -> None:
        self.writing.set()
        time.sleep(self.delay)
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        with self._lock:
            assert key not in self.held
            self.calls["put"] += 1
            self.held[key] = (copy.shape, copy.dtype, copy.order, bytes(memoryview(copy.buffer).cast("B")))
            self.nbytes += copy.nbytes

    def get(self, key, alloc):
        with self._lock:
            shape, dtype, order, data = self.held[key]
        buffer = alloc(len(data))
        np.frombuffer(buffer, dtype=np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)
        return HostCopy(shape, dtype, order, buffer)

    def delete(self, key) -> None:
        with self._lock:
            self.nbytes -= len(self.held.pop(key)[3])

    def close(self) -> None:
        self.held.clear()


def settled(s: TieredStore, timeout: float = 30.0) -> None:
    """Wait until the drain has nothing left to do."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with s._lock:
            if not s._wants_drain() and not s._inflight:
                return
        time.sleep(0.01)
    raise AssertionError(f"the drain did not settle: {s.summary()}")


@pytest.fixture
def small_margin(monkeypatch):
    # a 1 MiB margin at these sizes (the product's is 2 GiB at least)
    monkeypatch.setattr(store_module, "DRAIN_MIN", MB)
    monkeypatch.setattr(store_module, "DRAIN_VALUES", 1)
    monkeypatch.setattr(store_module, "DRAIN_SHARE", 1)


def make(tier, rank=None, host_mb=4):
    return TieredStore(device_limit=2 * MB, host_limit=host_mb * MB, codec=NumpyCodec(), below=[tier],
                       host=HostBuffers(), rank=rank, drain=True)


def test_the_drain_keeps_the_margin_free_writing_the_values_needed_last(small_margin):
    # key i is needed at step i: the largest are needed last and go below first
    tier = SlowTier()
    s = make(tier, rank=lambda k: k)
    for i in range(6):
        s[i] = chunk(i)
    settled(s)
    # 6 MiB for 2 on the device and 4 on the host: the drain leaves 1 MiB of the host free
    assert s.drain_margin == MB and s.host_bytes == 3 * MB and s.below_bytes == MB
    # the device kept 0 and 5, the host took 1 to 4: 4 is the host's needed last
    assert [i for i in range(6) if s.tier_of(i) == "disk"] == [4]
    assert s.stats.drained_bytes == MB == s.stats.bytes["host_to_disk"]
    # 4 is needed later (a task waits for it: it will be read back); none went for the
    # machine's room or on a spill's path for the limit
    assert s.stats.needed_written_bytes == MB
    assert s.stats.room_written_bytes == s.stats.limit_written_bytes == 0
    for i in range(6):
        np.testing.assert_array_equal(s[i], chunk(i))
    s.close()


def test_writes_below_on_the_spills_path_are_counted_as_the_limit_s_and_by_whether_a_task_waits():
    tier = SlowTier()
    # no drain: the spills write for the host tier's limit themselves; keys from 3 on are
    # needed by tasks here, the others by none
    s = TieredStore(device_limit=2 * MB, host_limit=2 * MB, codec=NumpyCodec(), below=[tier],
                    host=HostBuffers(), rank=lambda k: k if k >= 3 else None)
    for i in range(8):
        s[i] = chunk(i)
    on_disk = [i for i in range(8) if s.tier_of(i) == "disk"]
    assert on_disk and s.stats.bytes["host_to_disk"] == len(on_disk) * MB
    assert s.stats.limit_written_bytes == s.stats.bytes["host_to_disk"]
    assert s.stats.room_written_bytes == s.stats.drained_bytes == 0
    assert s.stats.needed_written_bytes == sum(MB for i in on_disk if i >= 3)
    # the keys no task waits for went first
    assert all(i < 3 for i in on_disk) or all(i in on_disk for i in range(3))
    s.close()


def test_what_fits_on_the_host_is_never_written_down(small_margin):
    tier = SlowTier()
    s = make(tier, host_mb=8)
    for i in range(6):  # 4 MiB on the host of 8: the margin is free already
        s[i] = chunk(i)
    time.sleep(3 * store_module.DRAIN_POLL_S)
    settled(s)
    assert tier.calls["put"] == 0 and s.stats.bytes["host_to_disk"] == 0 and s.host_bytes == 4 * MB
    s.close()


def test_a_spill_finds_its_room_made_and_writes_nothing_itself(small_margin):
    tier = SlowTier(delay=0.05)
    s = make(tier, rank=lambda k: -k)  # the oldest needed last
    for i in range(5):
        s[i] = chunk(i)
    settled(s)
    before = s.stats.bytes["host_to_disk"]
    assert before == s.stats.drained_bytes
    s[5] = chunk(5)  # its spill lands in the margin
    settled(s)
    # every write below was the drain's: none on the spill's own path
    assert s.stats.bytes["host_to_disk"] == s.stats.drained_bytes > before
    s.close()


def test_a_read_of_a_value_being_written_waits_for_the_write_and_gets_it(small_margin):
    tier = SlowTier(delay=0.5)
    s = make(tier, rank=lambda k: k)
    for i in range(6):
        s[i] = chunk(i)
    assert tier.writing.wait(10)
    assert s.tier_of(4) == "moving"  # in flight to the disk
    np.testing.assert_array_equal(s[4], chunk(4))
    settled(s)
    for i in range(6):
        np.testing.assert_array_equal(s[i], chunk(i))
    del s[4]
    assert 4 not in s and len(s) == 5
    s.close()


def test_a_write_that_fails_puts_the_value_back_on_the_host_and_loses_nothing(small_margin):
    tier = SlowTier()
    tier.full = True
    s = make(tier, rank=lambda k: k)
    for i in range(6):
        s[i] = chunk(i)
    time.sleep(3 * store_module.DRAIN_POLL_S)
    # nothing written, nothing lost: the host holds what it held, past its margin
    assert tier.nbytes == 0 and s.host_bytes == 4 * MB and s.stats.drained_bytes == 0
    assert sorted(s) == list(range(6)) and s.tier_of(4) == "host"
    for i in range(6):
        np.testing.assert_array_equal(s[i], chunk(i))
    s.close()


def test_close_waits_for_a_write_under_way(small_margin):
    tier = SlowTier(delay=0.3)
    s = make(tier, rank=lambda k: k)
    for i in range(6):
        s[i] = chunk(i)
    assert tier.writing.wait(10)
    s.close()
    assert not s._drain_thread.is_alive()


def test_the_drain_gives_back_clean_copies_before_it_writes_anything(small_margin):
    tier = SlowTier()
    s = make(tier, host_mb=4)
    for i in range(5):  # 3 and 4 on the device, 0 to 2 on the host
        s[i] = chunk(i)
    settled(s)
    assert tier.calls["put"] == 0  # 3 MiB of 4: the margin is free
    s[0]  # 3 spilled for it (3 MiB again), 0's copy kept: 4 MiB, the margin gone
    with s._lock:
        s._wake_drain()
    settled(s)
    assert s.summary()["host_clean_bytes"] == 0 and tier.calls["put"] == 0 and s.host_bytes == 3 * MB
    for i in range(5):
        np.testing.assert_array_equal(s[i], chunk(i))
    s.close()


def test_a_short_machine_is_drained_until_the_arena_has_a_slice_for_the_next_spill(small_margin, monkeypatch):
    from spillway.memory.arena import Arena
    from spillway.memory.books import HostBooks

    # a margin of three values: the whole arena, which a slice-for-the-margin rule would
    # empty to disk
    monkeypatch.setattr(store_module, "DRAIN_VALUES", 3)
    # the host tier may hold 64 MiB, but the machine is short whatever the store does: only
    # what frees the 3 MiB arena for the next spill is worth a write
    books = HostBooks(lambda: 0, headroom=MB, resident=lambda: 0)
    tier = SlowTier()
    s = TieredStore(device_limit=2 * MB, host_limit=64 * MB, codec=NumpyCodec(), below=[tier],
                    host=HostBuffers(Arena(np.zeros(3 * MB, dtype=np.uint8))), rank=lambda k: k,
                    books=books, drain=True)
    for i in range(5):  # 0 and 4 on the device; 1 to 3 fill the arena
        s[i] = chunk(i)
    settled(s)
    # one value written (the host's needed last) gives the next spill its arena slice, and
    # the drain stops there though the machine stays short
    assert tier.calls["put"] == 1 and s.tier_of(3) == "disk" and s.host.arena_fits(MB)
    for i in range(5):
        np.testing.assert_array_equal(s[i], chunk(i))
    s.close()


def test_bytes_said_to_go_to_disk_are_written_ahead_while_the_host_has_room_those_no_task_waits_for(small_margin):
    tier = SlowTier()
    # 0, 1 and 2 are needed by no task here (outputs held for the client), 3 on are
    s = make(tier, rank=lambda k: None if k < 3 else k, host_mb=16)
    for i in range(6):  # 4 MiB on the host of 16: the margin is free, nothing must go
        s[i] = chunk(i)
    settled(s)
    assert tier.calls["put"] == 0
    s.write_ahead(int(1.5 * MB))  # the scheduler: this graph writes 1.5 MiB here whatever
    settled(s)
    # two of the unneeded (the budget's last write may pass it: a group goes whole), none
    # a task waits for, and then no more
    on_disk = [i for i in range(6) if s.tier_of(i) == "disk"]
    assert len(on_disk) == 2 and all(i < 3 for i in on_disk), on_disk
    assert s.stats.drained_bytes == 2 * MB and s.stats.needed_written_bytes == 0 and s.ahead_bytes == 0
    s.write_ahead(8 * MB)  # more than there is unneeded: the last one, then the drain stops
    settled(s)
    assert [i for i in range(6) if s.tier_of(i) == "disk"] == [0, 1, 2]
    assert s.ahead_bytes == 7 * MB
    for i in range(6):
        np.testing.assert_array_equal(s[i], chunk(i))
    s.close()


def test_the_host_room_is_what_the_machine_lets_the_tier_hold_under_its_limit():
    from spillway.memory.books import HostBooks

    free = [64 * MB]
    books = HostBooks(available=lambda: free[0], headroom=16 * MB, resident=lambda: 0)
    s = TieredStore(device_limit=2 * MB, host_limit=1024 * MB, codec=NumpyCodec(), below=[SlowTier()],
                    host=HostBuffers(), books=books)
    assert s.host_room == 48 * MB  # nothing held yet: available past the headroom
    for i in range(4):  # 2 MiB spilled into pageable buffers, taken from the machine
        s[i] = chunk(i)
    free[0] -= 2 * MB
    assert s.host_bytes == 2 * MB and s.host_room == 48 * MB  # what it holds counts in
    s.close()



def test_a_buffer_touched_ahead_leaves_the_drain_its_margin():
    """The store lets its host buffers touch a pageable buffer ahead only where the machine
    keeps the drain's margin beside it: one that took the margin would make the drain write
    values to disk for a buffer no spill may take."""
    from spillway.memory.books import HostBooks

    free = [64 * MB]
    books = HostBooks(available=lambda: free[0], headroom=16 * MB, resident=lambda: 0)
    s = TieredStore(device_limit=2 * MB, host_limit=1024 * MB, codec=NumpyCodec(), below=[SlowTier()],
                    host=HostBuffers(), books=books)
    try:
        margin = s.drain_margin
        assert margin > 0
        room = free[0] - books.headroom
        assert s.host.has_room(room - margin)
        assert not s.host.has_room(room - margin + 1)
        free[0] = books.headroom  # the machine at its headroom: nothing ahead
        assert not s.host.has_room(1)
    finally:
        s.close()


def test_a_write_ahead_ended_by_the_scheduler_writes_nothing_of_the_next_graph_s_inputs(small_margin):
    """Once the scheduler says its admitted graphs are all in memory (a word of 0 bytes),
    what was left of the budget is not written: the next graph's inputs, held on the host
    before its tasks ask for them, are needed by no task yet and would be read back."""
    tier = SlowTier()
    s = make(tier, rank=lambda k: None, host_mb=16)
    s.write_ahead(8 * MB)
    s[0], s[1] = chunk(0), chunk(1)  # the graph's outputs: on the device
    s.write_ahead(0)  # the graph is in memory
    assert s.ahead_bytes == 0 and s.stats.ahead_said_bytes == 8 * MB
    for i in range(2, 6):  # the next graph's inputs, 2 to 5, pushed to the host
        s[i] = chunk(i)
    settled(s)
    assert tier.calls["put"] == 0 and s.stats.drained_bytes == 0
    for i in range(6):
        np.testing.assert_array_equal(s[i], chunk(i))
    s.close()
