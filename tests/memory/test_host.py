"""Host buffers over an arena that grows on a background thread, with stand-in pinned
allocators (NumPy buffers, with a delay or a failure where a test needs one)."""

from __future__ import annotations

import logging
import random
import threading
import time

import numpy as np
import pytest

from spillway.memory.arena import Arena
from spillway.memory.growth import ArenaGrowth, headroom_for
from spillway.memory.host import HostBuffers

pytestmark = pytest.mark.timeout(60)

MB = 1 << 20
SEG = 4 * MB


def pinned_held(host: HostBuffers) -> int:
    """Pinned bytes ``host`` counts against its limit: the arena, segments being taken,
    and on-demand buffers in use (read under its lock, as the growth thread reads it)."""
    with host._lock:
        return host._held()


class Pins:
    """Stand-in pinned memory: counts every byte pinned that is still in use, segments
    being taken included, independently of HostBuffers' own accounting, and records the
    highest count seen."""

    def __init__(self, delay: float = 0.0, fail_on: int | None = None, gate: threading.Event | None = None):
        self.delay = delay
        self.fail_on = fail_on  # the segment (1-based) whose pin fails
        self.gate = gate
        self.segments = 0
        self.steps = 0
        self.calls_after_close = 0
        self.closed = False
        self.live = 0
        self.peak = 0
        self.on_demand: dict[int, int] = {}
        self._lock = threading.Lock()

    def _add(self, n: int) -> None:
        with self._lock:
            self.live += n
            self.peak = max(self.peak, self.live)

    #: steps a segment is touched in, each after a call to ``between`` where given
    STEPS = 4

    def take(self, n: int, between=None) -> np.ndarray:
        """The arena's segment allocator."""
        if self.closed:
            self.calls_after_close += 1
        self.segments += 1
        if self.fail_on is not None and self.segments >= self.fail_on:
            raise RuntimeError("cudaErrorMemoryAllocation: out of memory")
        for _ in range(self.STEPS):
            if between is not None:
                between()
            self.steps += 1
        self._add(n)
        if self.gate is not None:
            self.gate.wait()
        if self.delay:
            time.sleep(self.delay)
        return np.zeros(n, dtype=np.uint8)

    def pinned(self, n: int) -> np.ndarray:
        """The on-demand allocator."""
        self._add(n)
        buf = np.empty(n, dtype=np.uint8)
        with self._lock:
            self.on_demand[buf.__array_interface__["data"][0]] = n
        return buf

    def released(self, buf: np.ndarray) -> None:
        with self._lock:
            n = self.on_demand.pop(buf.__array_interface__["data"][0], 0)
            self.live -= n


def host_with(pins: Pins, limit: float, *, pageable=None) -> HostBuffers:
    host = HostBuffers(None, pins.pinned, pinned_limit=limit, pageable=pageable)
    release = host.release

    def tracked_release(buf):
        pins.released(buf)  # first: the stand-in never counts less than is in use
        release(buf)

    host.release = tracked_release
    return host


def wait_for(predicate, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.005)


def grow(host: HostBuffers, target: int, pins: Pins, **kwargs) -> ArenaGrowth:
    kwargs.setdefault("segment_bytes", SEG)
    kwargs.setdefault("retry_s", 0.01)
    return host.grow_arena(target, pins.take, **kwargs)


# --- the arena's segments


def test_arena_slices_never_span_segments_and_merge_when_freed():
    a = Arena(np.zeros(2 * MB, dtype=np.uint8))
    a.add(np.zeros(2 * MB, dtype=np.uint8))
    assert a.capacity == 4 * MB and a.segments == 2
    assert a.allocate(3 * MB) is None  # fits in 4 MB only across the two
    x, y = a.allocate(MB), a.allocate(MB)
    z = a.allocate(2 * MB)  # the second segment
    assert all(a.owns(v) for v in (x, y, z)) and a.used_bytes == 4 * MB
    assert a.allocate(1) is None
    a.free(x)
    a.free(y)
    w = a.allocate(2 * MB)  # fits only because x and y merged
    assert w is not None and a.used_bytes == 4 * MB
    a.free(w)
    a.free(z)
    assert a.used_bytes == 0 and not a.owns(np.zeros(8, dtype=np.uint8))
    with pytest.raises(ValueError):
        a.free(np.zeros(8, dtype=np.uint8))


# --- growth: before, during and after


def test_allocations_fall_back_until_a_segment_is_in_then_use_the_arena():
    gate = threading.Event()
    pins = Pins(gate=gate)
    host = host_with(pins, limit=64 * MB)
    growth = grow(host, 3 * SEG, pins)
    wait_for(lambda: pins.segments == 1)  # the first segment is being taken
    early = host.alloc(MB)
    assert host.arena is None and host.pinned_bytes == MB  # pinned on demand
    assert growth.summary()["arena_ready_s"] is None and growth.state == "growing"
    gate.set()
    wait_for(lambda: growth.ready)
    late = host.alloc(MB)
    assert host.arena.owns(late) and not host.arena.owns(early)
    assert host.arena.capacity == 3 * SEG and host.arena.segments == 3
    summary = host.summary()
    assert summary["arena_bytes"] == 3 * SEG and summary["arena_state"] == "ready"
    assert 0 <= summary["arena_first_segment_s"] <= summary["arena_ready_s"]
    assert summary["arena_ready_at"] == pytest.approx(summary["arena_started_at"] + summary["arena_ready_s"])
    host.release(early)
    host.release(late)
    assert host.pinned_bytes == 0 and host.arena.used_bytes == 0 and pins.live == 3 * SEG


def test_release_returns_bytes_to_the_arena_and_to_the_limit():
    pins = Pins()
    host = host_with(pins, limit=SEG + 2 * MB)
    grow(host, SEG, pins).join(5)
    a = host.alloc(3 * MB)
    b = host.alloc(2 * MB)  # the arena has 1 MB left: pinned on demand
    c = host.alloc(MB)  # the arena's last MB
    d = host.alloc(MB)  # arena full, limit full: pageable
    assert host.arena.owns(a) and host.arena.owns(c) and host.pinned_bytes == 2 * MB
    assert host.pageable_total == MB and not host.arena.owns(d)
    for buf in (a, b, c, d):
        host.release(buf)
    assert host.arena.used_bytes == 0 and host.pinned_bytes == 0
    assert host.arena.owns(host.alloc(SEG))  # all of it back, in one piece


def test_a_value_larger_than_a_segment_goes_to_the_fallback():
    pins = Pins()
    host = host_with(pins, limit=64 * MB)
    grow(host, 2 * SEG, pins).join(5)
    big = host.alloc(SEG + MB)  # fits in the arena's total, not in one segment
    assert not host.arena.owns(big) and host.pinned_bytes == SEG + MB


def test_later_segments_hold_several_of_the_largest_value_asked_for():
    pins = Pins(gate=threading.Event())
    host = host_with(pins, limit=1 << 40)
    growth = grow(host, 64 * MB, pins)
    wait_for(lambda: pins.segments == 1)
    host.alloc(3 * MB)  # larger than a quarter of a 4 MB segment
    pins.gate.set()
    growth.join(5)
    sizes = sorted({s.capacity for s in host.arena._segments})
    assert sizes == [SEG, 12 * MB]  # the first as planned, then 4 x 3 MB
    assert host.arena.capacity == 64 * MB


def test_the_limit_holds_under_concurrent_allocations_while_the_arena_grows():
    limit = 10 * SEG + 3 * MB
    pins = Pins(delay=0.002)
    host = host_with(pins, limit=limit)
    # the arena aims at the whole limit: every segment competes with on-demand pins
    growth = grow(host, limit, pins, segment_bytes=MB)
    seen = {"max": 0}
    stop = threading.Event()

    def monitor():
        while not stop.is_set():
            seen["max"] = max(seen["max"], pinned_held(host))
            time.sleep(0)

    def worker(seed):
        rng = random.Random(seed)
        held = []
        for _ in range(300):
            if held and rng.random() < 0.45:
                host.release(held.pop(rng.randrange(len(held))))
            else:
                held.append(host.alloc(rng.choice([64 << 10, 256 << 10, MB, 2 * MB])))
        for buf in held:
            host.release(buf)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    watcher = threading.Thread(target=monitor)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    wait_for(lambda: growth.ready or growth.state.startswith("waiting"), 10)
    stop.set()
    watcher.join()
    growth.stop()
    assert pins.peak <= limit, (pins.peak, limit)  # what really was pinned at once
    assert seen["max"] <= limit and pinned_held(host) <= limit
    # how many segments the arena took meanwhile is the threads' scheduling (one on a loaded
    # machine): the limit above is what must hold, however far it grew
    assert host.pinned_bytes == 0 and host.arena.used_bytes == 0 and host.arena.segments >= 1
    assert host.pageable_total > 0  # the limit was reached: past it, pageable buffers


def test_growth_waits_while_on_demand_pins_hold_the_limit():
    pins = Pins()
    host = host_with(pins, limit=2 * SEG)
    held = host.alloc(SEG + MB)  # before the arena: on demand
    growth = grow(host, 2 * SEG, pins)
    wait_for(lambda: growth.state == "waiting for the pinned limit")
    assert host.arena is None and pins.segments == 0 and pinned_held(host) == SEG + MB
    host.release(held)
    growth.join(5)
    assert growth.ready and host.arena.capacity == 2 * SEG and pins.peak <= 2 * SEG


def test_growth_trims_cached_pins_before_each_segment():
    pins = Pins()
    trims = []
    host = host_with(pins, limit=1 << 40)
    grow(host, 3 * SEG, pins, trim=lambda: trims.append(pins.segments)).join(5)
    assert trims == [0, 1, 2]


def test_growth_waits_for_host_memory_then_goes_on():
    pins = Pins()
    free = {"bytes": 5 * MB}
    host = host_with(pins, limit=1 << 40)
    growth = grow(host, 3 * SEG, pins, available=lambda: free["bytes"], headroom=2 * MB)
    wait_for(lambda: growth.state == "waiting for host memory")
    assert pins.segments == 0  # 5 MB free less a 4 MB segment leaves under 2 MB
    free["bytes"] = 1 << 40
    growth.join(5)
    assert growth.ready and host.arena.capacity == 3 * SEG


def test_headroom_is_a_tenth_of_the_host_and_at_least_2_gib():
    assert headroom_for(270 * 10**9) == 27 * 10**9 and headroom_for(8 << 30) == 2 << 30


def test_a_failed_pin_stops_growth_and_keeps_what_was_taken(caplog):
    pins = Pins(fail_on=3)
    host = host_with(pins, limit=1 << 40)
    with caplog.at_level(logging.WARNING, logger="spillway.memory"):
        growth = grow(host, 8 * SEG, pins)
        growth.join(5)
    assert not growth.is_alive() and not growth.ready
    assert growth.state.startswith("stopped: pinning") and "out of memory" in growth.state
    assert host.arena.capacity == 2 * SEG and pinned_held(host) == 2 * SEG  # the reservation came back
    assert pins.segments == 3  # no retry
    warnings = [r for r in caplog.records if "could not pin" in r.getMessage()]
    assert len(warnings) == 1
    assert host.arena.owns(host.alloc(MB))  # what it has still serves


def test_an_error_in_the_thread_never_escapes_it():
    host = HostBuffers(None, None, pinned_limit=1 << 40)
    growth = host.grow_arena(SEG, lambda n: np.zeros(n // 8), segment_bytes=SEG)  # not uint8
    growth.join(5)
    assert growth.state.startswith("stopped: ValueError") and not growth.is_alive()
    assert host.arena is None and pinned_held(host) == 0  # its reservation came back


def test_close_stops_growth_and_nothing_is_taken_after_it():
    pins = Pins(delay=0.02)
    host = host_with(pins, limit=1 << 40)
    growth = grow(host, 100 * SEG, pins)
    wait_for(lambda: host.arena is not None and host.arena.segments >= 2)
    host.close()
    pins.closed = True
    assert not growth.is_alive() and growth.state == "stopped: closed"
    capacity = host.arena.capacity
    time.sleep(0.1)
    assert pins.calls_after_close == 0 and host.arena.capacity == capacity < 100 * SEG
    assert pinned_held(host) == capacity  # no reservation left behind


def test_a_segment_taken_while_closing_is_not_used():
    gate = threading.Event()
    pins = Pins(gate=gate)
    host = host_with(pins, limit=1 << 40)
    given_back = []
    growth = grow(host, 4 * SEG, pins, give_back=given_back.append)
    wait_for(lambda: pins.segments == 1)
    closer = threading.Thread(target=host.close)
    closer.start()
    wait_for(lambda: growth._closing.is_set())
    gate.set()
    closer.join(5)
    growth.join(5)
    assert growth.state == "stopped: closed" and host.arena is None and pinned_held(host) == 0
    assert [b.nbytes for b in given_back] == [SEG]  # unpinned, not left pinned and unused


def test_growth_stops_when_the_worker_closes():
    pins = Pins(delay=0.01)
    closing = threading.Event()
    host = host_with(pins, limit=1 << 40)
    growth = grow(host, 100 * SEG, pins, should_stop=closing.is_set)
    wait_for(lambda: pins.segments >= 1)
    closing.set()
    growth.join(5)
    assert growth.state == "stopped: worker closing" and host.arena.capacity < 100 * SEG


def test_growth_never_passes_the_pinned_limit():
    pins = Pins()
    host = host_with(pins, limit=2 * SEG + MB)
    growth = grow(host, 10 * SEG, pins)  # asked for more than the limit
    growth.join(5)
    assert growth.ready and growth.target == 2 * SEG + MB and host.arena.capacity == 2 * SEG + MB


def test_growth_runs_at_the_lowest_priority():
    import os

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    niceness = {}

    def prepare():
        niceness["thread"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    pins = Pins()
    host = host_with(pins, limit=1 << 40)
    grow(host, SEG, pins, prepare=prepare).join(5)
    assert niceness["thread"] == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before  # this thread untouched


# --- pins wait for a quiet worker


def test_segments_are_touched_and_pinned_only_once_the_worker_has_been_quiet():
    # pinning holds the driver's locks against every CUDA call, and touching by the
    # gigabyte slowed a fresh cluster's first runs: both wait for a worker at no work
    pins = Pins()
    pinned = []
    busy = threading.Event()
    busy.set()
    host = host_with(pins, limit=1 << 40)
    growth = grow(host, 2 * SEG, pins, pin=pinned.append, busy=busy.is_set, quiet_s=0.2)
    wait_for(lambda: growth.state == "touching: waiting for a quiet worker")
    time.sleep(0.3)
    assert pins.steps == 0 and pinned == [] and host.arena is None  # not a step touched
    assert pinned_held(host) == SEG  # the segment being touched is reserved
    busy.clear()
    growth.join(5)
    assert growth.ready and [b.nbytes for b in pinned] == [SEG, SEG] and host.arena.capacity == 2 * SEG
    assert pins.steps == 2 * Pins.STEPS
    summary = growth.summary()
    assert [p["bytes"] for p in summary["arena_pins"]] == [SEG, SEG]
    assert all(p["start"] <= p["stop"] for p in summary["arena_pins"])
    assert summary["arena_touch_wait_s"] >= 0.3  # the busy spell at least


def test_work_arriving_mid_segment_stops_the_touching_at_the_next_step():
    pins = Pins()
    pinned = []
    busy = threading.Event()
    host = host_with(pins, limit=1 << 40)
    real_take = pins.take

    def take(n, between=None):
        def step():
            between()
            if pins.steps == 0:  # a task arrives while the first step is touched
                busy.set()

        return real_take(n, step)

    growth = host.grow_arena(SEG, take, segment_bytes=SEG, retry_s=0.01, pin=pinned.append, busy=busy.is_set,
                             quiet_s=0.1)
    wait_for(lambda: busy.is_set() and growth.state == "touching: waiting for a quiet worker")
    time.sleep(0.2)
    assert pins.steps == 1 and pinned == []
    busy.clear()
    growth.join(5)
    assert growth.ready and pins.steps == Pins.STEPS and len(pinned) == 1


def test_a_busy_spell_starts_the_quiet_wait_again():
    pins = Pins()
    pinned = []
    busy = threading.Event()
    host = host_with(pins, limit=1 << 40)
    growth = grow(host, SEG, pins, pin=pinned.append, busy=busy.is_set, quiet_s=0.5)
    wait_for(lambda: pins.segments == 1)
    for _ in range(4):  # quiet for less than quiet_s at a time
        time.sleep(0.25)
        busy.set()
        time.sleep(0.05)
        busy.clear()
    assert pinned == []
    growth.join(5)
    assert pinned and growth.ready


def test_a_spill_that_misses_the_arena_has_segments_pinned_while_the_worker_works():
    pins = Pins()
    pinned = []
    host = host_with(pins, limit=1 << 40)
    growth = grow(host, 2 * SEG, pins, pin=pinned.append, busy=lambda: True, quiet_s=60)
    wait_for(lambda: "waiting for a quiet worker" in growth.state)
    assert pinned == []
    buf = host.alloc(MB)  # no arena yet: on demand, and the arena is wanted from now on
    assert host.wanted.is_set()
    growth.join(5)
    assert growth.ready and len(pinned) == 2
    host.release(buf)
    assert host.alloc(MB) is not None and host.arena.used_bytes >= MB  # the arena serves now


def test_closing_while_a_segment_waits_to_be_pinned_pins_nothing_and_keeps_no_reservation():
    pins = Pins()
    pinned, given_back = [], []
    host = host_with(pins, limit=1 << 40)
    growth = grow(host, 2 * SEG, pins, pin=pinned.append, busy=lambda: True, give_back=given_back.append)
    wait_for(lambda: "waiting for a quiet worker" in growth.state)
    host.close()
    assert not growth.is_alive() and growth.state == "stopped: closed"
    assert pinned == [] and given_back == [] and host.arena is None and pinned_held(host) == 0


def test_a_pin_that_fails_stops_growth_keeping_the_segments_pinned_before(caplog):
    pins = Pins()
    calls = []

    def pin(buf):
        calls.append(buf.nbytes)
        if len(calls) == 2:
            raise RuntimeError("cudaErrorHostMemoryAlreadyRegistered")

    host = host_with(pins, limit=1 << 40)
    with caplog.at_level(logging.WARNING, "spillway.memory"):
        growth = grow(host, 3 * SEG, pins, pin=pin, busy=lambda: False, quiet_s=0.0)
        growth.join(5)
    assert growth.state.startswith("stopped: pinning") and host.arena.capacity == SEG
    assert pinned_held(host) == SEG and "could not pin" in caplog.text


def test_the_worker_is_busy_while_it_runs_a_task_or_moves_data(monkeypatch):
    from types import SimpleNamespace

    from distributed import Worker

    from spillway.memory.worker import _worker_busy

    from spillway import upstream

    state = SimpleNamespace(executing_count=0, long_running=set(), transfer_incoming_count=0)
    worker = SimpleNamespace(state=state, **{name: 0 for name in upstream.OUTGOING})
    monkeypatch.setattr(Worker, "_instances", [worker])
    assert not _worker_busy()
    for name, value in (("executing_count", 1), ("long_running", {"a seceded task"}),
                        ("transfer_incoming_count", 2)):
        setattr(state, name, value)
        assert _worker_busy(), name
        setattr(state, name, type(value)())
    worker.transfer_outgoing_count = 1
    assert _worker_busy()


# --- the worker's segments: touched first, then pinned


def test_segments_are_touched_then_registered_page_aligned(monkeypatch):
    import ctypes
    import sys
    import types

    from spillway.memory import worker

    calls = []
    memset = ctypes.memset

    def recording_memset(ptr, value, nbytes):
        calls.append(("touch", ptr, nbytes))
        return memset(ptr, value, nbytes)

    runtime = types.SimpleNamespace(
        hostRegister=lambda ptr, nbytes, flags: calls.append(("pin", ptr, nbytes, flags)),
        hostUnregister=lambda ptr: calls.append(("unpin", ptr)))
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(runtime=runtime)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(ctypes, "memset", recording_memset)
    monkeypatch.setattr(worker, "_TOUCH_STEP", MB)  # several touches, the last one partial
    n = 3 * MB + 8192
    for threads in (1, 3):
        monkeypatch.setattr(worker, "_TOUCH_THREADS", threads)
        calls.clear()
        buf = worker.take_segment(n)
        ptr = buf.ctypes.data
        assert buf.dtype == np.uint8 and buf.nbytes == n and ptr % 4096 == 0
        assert not buf.any()
        # every byte written, in steps (on several threads, in any order), before the one
        # pin of the whole segment
        touches = sorted(c for c in calls if c[0] == "touch")
        assert touches == [("touch", ptr, MB), ("touch", ptr + MB, MB), ("touch", ptr + 2 * MB, MB),
                           ("touch", ptr + 3 * MB, 8192)]
        assert calls[-1] == ("pin", ptr, n, 1) and len(calls) == 5
        worker.give_back_segment(buf)
        assert calls[-1] == ("unpin", ptr)
        # the growth's look before each step, and its stop raised out of the touch
        looks = []
        assert worker.touch_segment(n, between=lambda: looks.append(1)).nbytes == n and len(looks) == 4
        from spillway.memory.growth import GrowthClosed

        def closed():
            raise GrowthClosed

        calls.clear()
        with pytest.raises(GrowthClosed):
            worker.touch_segment(n, between=closed)
        assert not [c for c in calls if c[0] == "touch"]


def test_growth_sees_the_worker_of_its_process_closing(monkeypatch):
    from distributed import Worker
    from distributed.core import Status

    from spillway.memory.worker import _worker_closing

    class FakeWorker:
        status = Status.running

    worker = FakeWorker()
    monkeypatch.setattr(Worker, "_instances", [])
    assert not _worker_closing()  # the store is built before its worker registers itself
    Worker._instances.append(worker)
    assert not _worker_closing()
    worker.status = Status.closing
    assert _worker_closing()


# --- on a GPU: real pinned segments


@pytest.mark.gpu
def test_real_segments_are_pinned_and_spills_copy_into_them():
    import cupy

    from spillway.memory.worker import _pinned_fallback, start_arena, take_segment

    seg = take_segment(8 * MB)
    attrs = cupy.cuda.runtime.pointerGetAttributes(seg.__array_interface__["data"][0])
    assert attrs.type == 1  # cudaMemoryTypeHost: page-locked (pageable memory reads 0)
    host = HostBuffers(None, _pinned_fallback, pinned_limit=1 << 40)
    growth = start_arena(host, 64 * MB)
    growth.join(60)
    assert growth.ready and host.arena.capacity == 64 * MB, growth.state
    x = cupy.arange(MB, dtype=cupy.float64)
    buf = host.alloc(x.nbytes)
    assert host.arena.owns(buf)
    cupy.cuda.runtime.memcpy(buf.__array_interface__["data"][0], x.data.ptr, x.nbytes,
                             cupy.cuda.runtime.memcpyDeviceToHost)
    np.testing.assert_array_equal(buf.view(np.float64), np.arange(MB, dtype=np.float64))
    host.release(buf)
    host.close()


def test_large_pageable_buffers_come_touched_and_small_ones_plain():
    """A pageable spill buffer from 64 MiB up has its pages before the copy writes it
    (the process's resident memory grew by it); a small one is a plain numpy buffer."""
    import psutil

    from spillway.memory.host import TOUCH_FROM
    from spillway.memory.worker import touched_pageable

    small = touched_pageable(4096)
    assert small.nbytes == 4096 and small.dtype == np.uint8
    before = psutil.Process().memory_info().rss
    big = touched_pageable(TOUCH_FROM)
    grew = psutil.Process().memory_info().rss - before
    assert big.nbytes == TOUCH_FROM and not big.any()
    assert grew >= 0.9 * TOUCH_FROM, grew
    big[:] = 7  # writable
    assert int(big[-1]) == 7


def test_the_worker_counts_as_busy_to_its_arena_while_its_cluster_starts(monkeypatch):
    import time
    from types import SimpleNamespace

    from distributed import Worker

    from spillway import upstream
    from spillway.memory import worker as memory_worker

    state = SimpleNamespace(executing_count=0, long_running=set(), transfer_incoming_count=0)
    host = HostBuffers()
    idle = SimpleNamespace(state=state, data=SimpleNamespace(host=host), **{name: 0 for name in upstream.OUTGOING})
    monkeypatch.setattr(Worker, "_instances", [idle])
    assert not memory_worker._worker_busy()  # no arena started: nothing held
    # as start_arena sets it, on the worker's host buffers: held while the cluster starts
    hold = host.start_hold = memory_worker.StartHold()
    assert memory_worker._worker_busy(hold)
    monkeypatch.setattr(Worker, "_instances", [])
    assert not memory_worker._worker_busy(hold)  # a store outside any worker has no cluster to wait for
    monkeypatch.setattr(Worker, "_instances", [idle])
    memory_worker.cluster_ready(idle)  # the launcher's word, reached through the worker
    assert not memory_worker._worker_busy(hold)
    # a worker whose cluster never says so (one that joined later) grows once the hold ends
    late = memory_worker.StartHold(seconds=-1)
    assert not memory_worker._worker_busy(late)
    assert memory_worker._worker_busy(memory_worker.StartHold())  # another worker's hold: its own



# --- pageable buffers touched ahead of the spills


def _wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_pageable_buffers_are_touched_ahead_on_their_own_thread_and_the_next_spills_take_them():
    """Past the pinned memory, the first pageable buffer of a size makes a thread of the
    host's own touch more of it; the next spills of that size take those, not new ones,
    and none of them was taken on the spilling thread."""
    from spillway.memory.host import TOUCH_FROM

    size = TOUCH_FROM
    takers = []

    def pageable(n):
        takers.append(threading.current_thread().name)
        return np.empty(n, dtype=np.uint8)

    host = HostBuffers(None, None, pageable=pageable, pageable_cache=64 * size, touch_ahead=3 * size)
    try:
        first = host.alloc(size)
        assert _wait_for(lambda: host.kept_bytes == 3 * size), host.kept_bytes
        assert host.ahead_total == 3 * size and host.held_bytes == 4 * size
        before = len(takers)
        rest = [host.alloc(size) for _ in range(3)]
        assert host.taken_from["kept"] == 3 * size and host.taken_from["pageable"] == size
        assert takers[0] == threading.current_thread().name  # the first: no buffer was ready
        assert all(t == "spillway-touch-ahead" for t in takers[1:before])
        # taking the kept ones made the thread touch the next ones
        assert _wait_for(lambda: host.kept_bytes == 3 * size)
        for b in [first, *rest]:
            host.release(b)
    finally:
        host.close()
    assert not host._ahead_thread.is_alive() or _wait_for(lambda: not host._ahead_thread.is_alive(), 3)


def test_nothing_is_touched_ahead_without_room_on_the_machine_or_in_the_host_tier():
    """A buffer touched ahead never takes memory the machine lacks (the store's books say
    so through ``has_room``), nor passes the host tier's cache of pageable buffers."""
    from spillway.memory.host import TOUCH_FROM

    size = TOUCH_FROM
    host = HostBuffers(None, None, pageable_cache=64 * size, touch_ahead=4 * size)
    room = [False]
    host.has_room = lambda n: room[0]
    try:
        host.alloc(size)
        time.sleep(0.2)
        assert host.kept_bytes == 0 and host.ahead_total == 0
        room[0] = True
        host.alloc(size)
        assert _wait_for(lambda: host.kept_bytes == 4 * size)
    finally:
        host.close()
    capped = HostBuffers(None, None, pageable_cache=3 * size, touch_ahead=8 * size)
    try:
        capped.alloc(size)
        capped.touch_ahead(size)
        assert _wait_for(lambda: capped.kept_bytes == 2 * size)
        time.sleep(0.2)
        assert capped.kept_bytes + capped.pageable_bytes == 3 * size  # the cache's bound
    finally:
        capped.close()


def test_small_buffers_and_buffers_inside_the_pinned_limit_are_not_touched_ahead():
    """Buffers under TOUCH_FROM cost little to take where they are needed, and while the
    pinned path still takes requests the spills need no pageable buffer."""
    from spillway.memory.host import TOUCH_FROM

    host = HostBuffers(None, None, pageable_cache=1 << 40, touch_ahead=1 << 30)
    try:
        host.alloc(TOUCH_FROM // 2)
        time.sleep(0.2)
        assert host.ahead_total == 0 and host._ahead_thread is None
    finally:
        host.close()
    arena = Arena(np.empty(4 * TOUCH_FROM, dtype=np.uint8))
    roomy = HostBuffers(arena, lambda n: np.empty(n, dtype=np.uint8), pinned_limit=1 << 40,
                        pageable_cache=1 << 40, touch_ahead=8 * TOUCH_FROM)
    try:
        roomy.alloc(TOUCH_FROM)  # from the arena, more pinned memory to come
        roomy.alloc(8 * TOUCH_FROM)  # pinned on demand
        time.sleep(0.2)
        assert roomy.ahead_total == 0
    finally:
        roomy.close()
