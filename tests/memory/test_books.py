"""The host's real memory beside the store's books: every buffer that takes new host memory
leaves the machine its headroom and the process within its limit, and "no limit" is one
form (None) through the store."""

from __future__ import annotations

import numpy as np
import pytest
from numpy_codec import NumpyCodec

from spillway.memory.arena import Arena
from spillway.memory.books import HostBooks
from spillway.memory.disk import DiskTier
from spillway.memory.host import HostBuffers
from spillway.memory.pause import HostPause
from spillway.memory.store import TieredStore

MB = 2**20


def chunk(i: int, mb: int = 1) -> np.ndarray:
    return np.random.default_rng(i).standard_normal(mb * MB // 8)


class Machine:
    """A machine of ``total`` bytes whose only large holder is the store's host buffers
    (plus ``other``, memory held outside the store)."""

    def __init__(self, total: int, other: int = 0):
        self.total = total
        self.other = other
        self.store = None
        self.lowest = total

    def resident(self) -> int:
        return self.store.host.held_bytes + self.other

    def available(self) -> int:
        free = self.total - self.resident()
        self.lowest = min(self.lowest, free)
        return free


def make(tmp_path, machine: Machine, *, device_mb=2, host_mb=None, arena=None, headroom_mb=4,
         process_limit=None) -> TieredStore:
    books = HostBooks(machine.available, headroom=headroom_mb * MB, process_limit=process_limit,
                      resident=machine.resident)
    store = TieredStore(device_limit=device_mb * MB, host_limit=None if host_mb is None else host_mb * MB,
                        codec=NumpyCodec(), below=[DiskTier(str(tmp_path))], host=HostBuffers(arena), books=books)
    machine.store = store
    return store


def test_the_machine_keeps_its_headroom_with_no_host_limit(tmp_path):
    # 12 MiB machine, 4 MiB headroom, no host limit: the host tier may only take 8 MiB
    machine = Machine(12 * MB)
    s = make(tmp_path, machine)
    for i in range(20):
        s[i] = chunk(i)
    assert machine.lowest >= 4 * MB, machine.lowest
    assert s.below_bytes >= 8 * MB and s.host_bytes <= 8 * MB
    assert s.books.short_events > 0
    for i in range(20):
        np.testing.assert_array_equal(s[i], chunk(i))
    assert machine.lowest >= 4 * MB


def test_a_fragmented_arena_does_not_skip_the_check(tmp_path):
    # The H100 run: an arena with room in all but no slice large enough made the store
    # take pageable buffers without asking the machine. Here the arena's two 3 MiB
    # segments each keep 1 MiB free (3 MiB pieces do not fit), the machine has nothing
    # beyond the arena and its headroom: a 3 MiB value must send others to disk first.
    arena = Arena(np.empty(3 * MB, np.uint8), np.empty(3 * MB, np.uint8))
    machine = Machine(6 * MB + 4 * MB + MB // 2)
    s = make(tmp_path, machine, device_mb=3, arena=arena)
    for i in range(4):  # 1 MiB values: four of them fill 2 MiB of each segment
        s[("small", i)] = chunk(i)
    s[("x", 0)] = chunk(10, 3)
    s[("x", 1)] = chunk(11, 3)  # the 3 MiB of x0 and the smalls leave the device
    assert s.host.arena.capacity - s.host.arena.used_bytes >= 3 * MB or s.below_bytes > 0
    assert machine.lowest >= 4 * MB, (machine.lowest, s.summary())
    for i in range(4):
        np.testing.assert_array_equal(s[("small", i)], chunk(i))
    np.testing.assert_array_equal(s[("x", 0)], chunk(10, 3))


def test_the_process_stays_within_its_limit(tmp_path):
    # plenty of machine, but the process may hold 10 MiB and already holds 4 outside the store
    machine = Machine(10**12, other=4 * MB)
    s = make(tmp_path, machine, process_limit=10 * MB, headroom_mb=0)
    peak = 0
    for i in range(16):
        s[i] = chunk(i)
        peak = max(peak, machine.resident())
    assert peak <= 10 * MB + MB, peak  # a buffer is checked before it is taken
    assert s.below_bytes > 0


def test_reads_back_from_disk_are_checked_too(tmp_path):
    machine = Machine(14 * MB)
    s = make(tmp_path, machine, device_mb=4)
    for i in range(16):
        s[i] = chunk(i)
    for i in range(16):  # every read of a disk value takes a host buffer first
        np.testing.assert_array_equal(s[i], chunk(i))
    assert machine.lowest >= 4 * MB, machine.lowest


def test_relieve_host_writes_until_the_headroom_is_back(tmp_path):
    machine = Machine(100 * MB)
    s = make(tmp_path, machine, device_mb=1)
    for i in range(8):
        s[i] = chunk(i)
    assert s.host_bytes == 7 * MB and s.below_bytes == 0
    machine.other = 92 * MB  # something outside the store took the machine
    written = s.relieve_host()
    assert written >= 3 * MB and machine.available() >= 4 * MB
    assert s.host_bytes + s.below_bytes == 7 * MB


def test_no_limit_is_none_through_the_store(tmp_path):
    s = TieredStore(device_limit=None, host_limit=None, codec=NumpyCodec(), below=[DiskTier(str(tmp_path))])
    for i in range(8):
        s[i] = chunk(i)
    assert s.device_bytes == 8 * MB and s.stats.bytes["device_to_host"] == 0
    assert "no limit" in s.exhausted(MB)
    assert s.prefetch([0]) == 0


def test_process_resident_reads_this_process():
    # in a process of its own: in this one, another test's threads (a module's cluster)
    # may give memory back while the block is touched, and the two cancel out
    import subprocess
    import sys

    script = (
        "import numpy as np\n"
        "from spillway.memory.books import process_resident\n"
        "before = process_resident()\n"
        "block = np.ones(64 * 2**20 // 8)  # touched pages\n"
        "print(process_resident() - before)\n")
    grown = int(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                               timeout=120).stdout)
    assert grown >= 48 * MB


class FakeWorker:
    def __init__(self):
        from distributed.core import Status

        self.status = Status.running


def test_the_worker_pauses_under_pressure_and_resumes(tmp_path):
    from distributed.core import Status

    machine = Machine(100 * MB)
    s = make(tmp_path, machine, device_mb=1, headroom_mb=10)
    for i in range(8):
        s[i] = chunk(i)
    worker = FakeWorker()
    pause = HostPause(worker, s)
    pause.tick()
    assert worker.status == Status.running and not pause.paused
    machine.other = 89 * MB  # under half the headroom: pause, and the host tier goes to disk
    pause.tick()
    assert worker.status == Status.paused and pause.pauses == 1
    pause._relieving.wait(0)  # the relief runs on a thread
    for _ in range(100):
        if not pause._relieving.is_set():
            break
        import time

        time.sleep(0.02)
    assert s.below_bytes > 0
    pause.tick()  # the headroom is back: resume
    assert worker.status == Status.running and not pause.paused and pause.paused_s > 0


@pytest.mark.parametrize("limit", ["device_memory_limit", "memory_limit"])
def test_admission_reads_no_limit_as_the_hardware(tmp_path, limit, monkeypatch):
    from spillway.memory import admission

    machine = Machine(64 * MB)
    s = make(tmp_path, machine, host_mb=8)
    if limit == "device_memory_limit":
        s.device_limit = None
    else:
        s.host_limit = None
    monkeypatch.setattr(admission, "_gpu_memory", lambda: 80 * MB)

    class Worker:
        data = s
        local_directory = str(tmp_path)

        class memory_manager:
            memory_limit = None

    cap = admission.worker_capacity(Worker)
    if limit == "device_memory_limit":
        assert cap["device"] == 80 * MB and cap["host"] == 8 * MB
    else:
        assert cap["device"] == 2 * MB and 0 < cap["host"] <= 60 * MB


def _wait_relieved(pause):
    import time

    for _ in range(200):
        if not pause._relieving.is_set():
            return
        time.sleep(0.01)


def test_a_pause_the_store_cannot_relieve_ends_with_the_numbers(tmp_path, caplog):
    # B3 on the H100 host: a worker whose own memory (its pinned pool) sat over its limit,
    # the host tier empty, stayed paused for good; it must resume and say why
    from distributed.core import Status

    machine = Machine(1000 * MB, other=60 * MB)
    s = make(tmp_path, machine, device_mb=8, headroom_mb=10, process_limit=50 * MB)
    worker = FakeWorker()
    pause = HostPause(worker, s)
    pause.tick()
    assert worker.status == Status.paused and pause.pauses == 1
    _wait_relieved(pause)
    with caplog.at_level("ERROR", logger="spillway.memory"):
        pause.tick()
    assert worker.status == Status.running and not pause.paused
    assert pause.process_floor == 60 * MB
    (record,) = [r for r in caplog.records if "no task running" in r.getMessage()]
    assert "over its 50.00 MiB memory limit" in record.getMessage()
    # it holds what it held: it stays running ...
    for _ in range(3):
        pause.tick()
    assert worker.status == Status.running
    # ... and pauses again once it grows past what it held by the margin
    machine.other = 60 * MB + 300 * MB
    pause.tick()
    assert worker.status == Status.paused and pause.pauses == 2
    # the machine's own headroom is read as before
    machine.other = 995 * MB
    _wait_relieved(pause)
    pause.tick()
    assert worker.status == Status.paused


def test_a_pause_waits_for_the_tasks_that_are_running(tmp_path):
    # a running task's temporaries are freed when it ends: that pause is kept
    from distributed.core import Status

    machine = Machine(1000 * MB, other=60 * MB)
    s = make(tmp_path, machine, device_mb=8, headroom_mb=10, process_limit=50 * MB)
    worker = FakeWorker()
    worker.state = type("State", (), {"executing_count": 1})()
    pause = HostPause(worker, s)
    pause.tick()
    _wait_relieved(pause)
    for _ in range(3):
        pause.tick()
        _wait_relieved(pause)
    assert worker.status == Status.paused and pause.process_floor is None
    worker.state.executing_count = 0
    pause.tick()
    assert worker.status == Status.running
