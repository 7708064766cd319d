"""The tiered store's logic with NumPy arrays in the device tier's place."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from numpy_codec import NumpyCodec
from tier_stacks import lowered, raised

from spillway.memory.arena import Arena
from spillway.memory.books import HostBooks
from spillway.memory.host import HostBuffers
from spillway.memory.store import TieredStore

MB = 2**20


def chunk(i: int, n: int = MB // 8) -> np.ndarray:
    return np.random.default_rng(i).standard_normal(n)  # 1 MiB float64


def make(below, device_mb=4, host_mb=4, rank=None, arena_mb=None, **kwargs):
    arena = Arena(np.empty(arena_mb * MB, dtype=np.uint8)) if arena_mb else None
    return TieredStore(device_limit=device_mb * MB, host_limit=host_mb * MB, codec=NumpyCodec(),
                       below=below(), host=HostBuffers(arena), rank=rank, **kwargs)


def test_values_stay_on_device_under_the_limit(below):
    s = make(below)
    for i in range(4):
        s[("x", i)] = chunk(i)
    assert all(s.tier_of(("x", i)) == "device" for i in range(4))
    assert s.device_bytes == 4 * MB and s.stats.bytes["device_to_host"] == 0


def test_spill_device_to_host_to_disk_and_back(below):
    s = make(below, device_mb=2, host_mb=2)
    for i in range(8):
        s[i] = chunk(i)
    tiers = [s.tier_of(i) for i in range(8)]
    below_host = {t.name for t in s.below}
    assert tiers.count("device") == 2 and tiers.count("host") == 2 and sum(t in below_host for t in tiers) == 4
    assert s.device_bytes <= 2 * MB and s.host_bytes <= 2 * MB
    for i in range(8):
        np.testing.assert_array_equal(s[i], chunk(i))
    st = s.stats
    assert st.bytes["device_to_host"] >= 6 * MB and st.bytes[lowered(s)] >= 4 * MB
    assert raised(s) >= 4 * MB and st.bytes["host_to_device"] >= 6 * MB
    assert st.wait_s > 0
    s.close()


def test_spills_go_to_disk_when_the_machine_runs_low_below_the_host_limit(below):
    # the host tier may hold 64 MiB, but the machine has 5 MiB left (less what the tier
    # holds) and must keep 4 MiB: past the first MiB, spills go to disk
    available = {"bytes": 5 * MB}
    books = HostBooks(lambda: available["bytes"] - s.host.held_bytes, headroom=4 * MB, resident=lambda: 0)
    s = make(below, device_mb=2, host_mb=64, books=books)
    for i in range(6):
        s[i] = chunk(i)
    assert s.host_bytes <= MB and s.below_bytes >= 3 * MB, s.summary()
    available["bytes"] = 64 * MB  # memory came back: the host tier fills again
    for i in range(6, 9):
        s[i] = chunk(i)
    assert s.host_bytes >= 3 * MB
    for i in range(9):
        np.testing.assert_array_equal(s[i], chunk(i))


def test_lru_without_ranks(below):
    s = make(below, device_mb=3)
    for i in range(3):
        s[i] = chunk(i)
    s[0]  # touch: 1 is now the least recently used
    s[3] = chunk(3)
    assert s.tier_of(1) == "host" and s.tier_of(0) == "device"


def test_eviction_follows_next_use(below):
    # key i is needed at step i, except 1 which no queued task needs
    needed = {0: 0, 2: 2, 3: 3, 4: 4}
    s = make(below, device_mb=3, rank=needed.get)
    for i in range(3):
        s[i] = chunk(i)
    s[3] = chunk(3)  # must evict 1 (unneeded) first
    assert s.tier_of(1) == "host"
    s[4] = chunk(4)  # then the one needed last among 0, 2, 3: key 3... but 4 is excluded
    assert s.tier_of(3) == "host" and s.tier_of(0) == "device" and s.tier_of(2) == "device"


def test_delete_frees_every_tier(below):
    s = make(below, device_mb=1, host_mb=1, arena_mb=2)
    for i in range(4):
        s[i] = chunk(i)
    for i in range(4):
        del s[i]
    assert len(s) == 0 and s.device_bytes == 0 and s.host_bytes == 0 and s.below_bytes == 0
    assert s.host.arena.used_bytes == 0
    with pytest.raises(KeyError):
        s[0]


def test_plain_objects_are_kept(below):
    s = make(below)
    s["scalar"] = 3.5
    s["list"] = [1, 2]
    assert s["scalar"] == 3.5 and s.tier_of("list") == "plain" and len(s) == 2


def test_overwrite_replaces(below):
    s = make(below, device_mb=1)
    s["a"] = chunk(1)
    s["b"] = chunk(2)  # a goes to host
    s["a"] = chunk(3)
    np.testing.assert_array_equal(s["a"], chunk(3))
    assert s.host_bytes + s.device_bytes == 2 * MB


def test_arena_host_buffers_are_reused(below):
    s = make(below, device_mb=1, host_mb=8, arena_mb=3)
    for i in range(6):
        s[i] = chunk(i)
        s[i - 1] if i else None
    assert s.host.arena.used_bytes <= 3 * MB
    for i in range(6):
        np.testing.assert_array_equal(s[i], chunk(i))


def test_strided_and_fortran_arrays_round_trip(below):
    s = make(below, device_mb=1)
    base = np.arange(256 * 512, dtype=np.float32).reshape(256, 512)
    s["t"] = base.T  # F-contiguous
    s["v"] = base[:, ::2]  # strided
    s["push"] = chunk(0)
    s["push2"] = chunk(1)
    np.testing.assert_array_equal(s["t"], base.T)
    np.testing.assert_array_equal(s["v"], base[:, ::2])


def test_prefetch_restores_the_next_needed(below):
    s = make(below, device_mb=4, host_mb=16)
    for i in range(8):
        s[i] = chunk(i)
    on_host = [i for i in range(8) if s.tier_of(i) == "host"]
    for i in range(8):
        if s.tier_of(i) == "device":
            del s[i]
    restored = s.prefetch(on_host[:2])
    assert restored == 2 * MB and all(s.tier_of(i) == "device" for i in on_host[:2])
    assert s.stats.prefetched_bytes == 2 * MB
    before = s.stats.wait_s
    np.testing.assert_array_equal(s[on_host[0]], chunk(on_host[0]))
    assert s.stats.wait_s == before  # already on the device: no wait


def test_prefetch_stops_at_headroom(below):
    s = make(below, device_mb=4, host_mb=16)
    for i in range(8):
        s[i] = chunk(i)
    host_keys = [i for i in range(8) if s.tier_of(i) == "host"]
    assert s.prefetch(host_keys) == 0  # the device tier is full


def test_evict_for_skips_the_inputs_of_running_tasks(below):
    running = {0}  # a running task reads key 0
    s = make(below, device_mb=8)
    s.in_use = lambda: running
    for i in range(4):
        s[i] = chunk(i)
    held = s[0]
    freed = s.evict_for(2 * MB)
    assert freed == 2 * MB
    assert s.tier_of(0) == "device"
    assert s.stats.ondemand_events == 1 and s.stats.ondemand_bytes == 2 * MB
    assert held is s[0]


def test_evict_for_with_everything_in_use_frees_nothing(below):
    s = make(below, device_mb=8)
    s.in_use = lambda: {0}
    s[0] = chunk(0)
    assert s.evict_for(MB) == 0 and s.tier_of(0) == "device"


def test_device_usage_counts_temporaries(below):
    usage = {"bytes": 0}
    s = TieredStore(device_limit=4 * MB, host_limit=64 * MB, codec=NumpyCodec(),
                    below=below(), device_usage=lambda: usage["bytes"])
    s[0] = chunk(0)
    s[1] = chunk(1)
    usage["bytes"] = 2 * MB + 3 * MB  # the stored two plus 3 MiB of temporaries
    s[2] = chunk(2)
    assert s.device_bytes <= 2 * MB  # made room for the temporaries, not only the count


def test_stress_many_evictions_every_value_checked(below):
    s = make(below, device_mb=3, host_mb=5, arena_mb=4)
    rng = np.random.default_rng(0)
    live = {}
    for step in range(400):
        op = rng.integers(0, 10)
        key = int(rng.integers(0, 40))
        if op < 5:
            value = chunk(step, n=int(rng.integers(1, MB // 8)))
            s[key] = value
            live[key] = value
        elif op < 8 and key in live:
            np.testing.assert_array_equal(s[key], live[key])
        elif op < 9 and key in live:
            del s[key]
            del live[key]
        else:
            s.prefetch(s.spilled(live)[:3])
        assert s.device_bytes <= 3 * MB + MB  # a value larger than the room still lands
    for key, value in live.items():
        np.testing.assert_array_equal(s[key], value)
    moved = s.stats.bytes
    assert moved["device_to_host"] > 0 and moved[lowered(s)] > 0 and raised(s) > 0


def test_concurrent_reads_and_prefetch(below):
    s = make(below, device_mb=4, host_mb=64)
    for i in range(32):
        s[i] = chunk(i)
    errors = []

    def reader(offset):
        try:
            for j in range(64):
                k = (j * 7 + offset) % 32
                np.testing.assert_array_equal(s[k], chunk(k))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def prefetcher():
        for _ in range(20):
            s.prefetch([k for k in range(32) if s.tier_of(k) == "host"][:2])

    threads = [threading.Thread(target=reader, args=(o,)) for o in range(3)] + [threading.Thread(target=prefetcher)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors


def test_arena_first_fit_and_merge():
    a = Arena(np.empty(64 * 4096, dtype=np.uint8))
    x = a.allocate(4096 * 10)
    y = a.allocate(4096 * 20)
    z = a.allocate(4096 * 34)
    assert a.allocate(1) is None
    a.free(y)
    a.free(x)
    w = a.allocate(4096 * 30)  # fits only because x and y merged
    assert w is not None and a.owns(w)
    a.free(w)
    a.free(z)
    assert a.used_bytes == 0 and a.allocate(64 * 4096) is not None


# --- host buffers: the arena, then pinned on demand up to the limit, then pageable


class Recorder:
    """A stand-in allocator that records what it handed out."""

    def __init__(self):
        self.sizes = []

    def __call__(self, n: int) -> np.ndarray:
        self.sizes.append(n)
        return np.empty(n, dtype=np.uint8)


def test_host_buffers_pin_on_demand_only_within_the_limit():
    pinned, pageable = Recorder(), Recorder()
    arena = Arena(np.empty(2 * MB, dtype=np.uint8))
    host = HostBuffers(arena, pinned, pinned_limit=5 * MB, pageable=pageable)
    a = host.alloc(2 * MB)  # the arena
    assert arena.owns(a) and not pinned.sizes
    b = host.alloc(2 * MB)  # arena full: pinned on demand (2 + 2 <= 5)
    assert pinned.sizes == [2 * MB] and host.pinned_bytes == 2 * MB
    c = host.alloc(2 * MB)  # 2 (arena) + 2 + 2 > 5: pageable
    assert pageable.sizes == [2 * MB] and host.pageable_total == 2 * MB
    host.release(b)  # the pinned bytes come back to the budget
    assert host.pinned_bytes == 0
    d = host.alloc(3 * MB)
    assert pinned.sizes == [2 * MB, 3 * MB] and host.pinned_bytes == 3 * MB
    host.release(c)  # pageable: nothing to account
    host.release(a)
    host.release(d)
    assert host.pinned_bytes == 0 and arena.used_bytes == 0


def test_a_failed_pinned_allocation_gives_its_bytes_back():
    def broken(n):
        raise MemoryError(f"cannot pin {n}")

    host = HostBuffers(None, broken, pinned_limit=10 * MB)
    with pytest.raises(MemoryError):
        host.alloc(MB)
    assert host.pinned_bytes == 0


def test_store_past_the_pinned_limit_still_round_trips_every_value(below):
    pinned, pageable = Recorder(), Recorder()
    host = HostBuffers(None, pinned, pinned_limit=3 * MB, pageable=pageable)
    s = TieredStore(device_limit=2 * MB, host_limit=64 * MB, codec=NumpyCodec(),
                    below=below(), host=host)
    for i in range(12):
        s[i] = chunk(i)
    assert pinned.sizes and pageable.sizes and host.pinned_bytes <= 3 * MB
    for i in range(12):
        np.testing.assert_array_equal(s[i], chunk(i))
    summary = s.summary()
    assert summary["host_pageable_total"] == host.pageable_total > 0


def test_spills_land_in_the_arena_when_the_host_tier_is_full(below):
    # the arena is as large as the host tier: every device -> host copy must find room in
    # it (the host tier spills to disk first), none may take a buffer pinned on demand
    pinned = Recorder()
    host = HostBuffers(Arena(np.empty(4 * MB, dtype=np.uint8)), pinned)
    s = TieredStore(device_limit=2 * MB, host_limit=4 * MB, codec=NumpyCodec(),
                    below=below(), host=host)
    for i in range(12):
        s[i] = chunk(i)
    assert s.stats.count["device_to_host"] == 10 and s.below_bytes == 6 * MB
    assert pinned.sizes == [] and host.arena.used_bytes == 4 * MB


def test_a_failed_spill_copy_keeps_the_value_on_the_device(below):
    def no_memory(n):
        raise MemoryError(f"no host buffer of {n} bytes")

    s = TieredStore(device_limit=2 * MB, host_limit=64 * MB, codec=NumpyCodec(),
                    below=below(), host=HostBuffers(pageable=no_memory))
    s["a"], s["b"] = chunk(0), chunk(1)
    with pytest.raises(MemoryError):
        s["c"] = chunk(2)
    np.testing.assert_array_equal(s["a"], chunk(0))
    np.testing.assert_array_equal(s["b"], chunk(1))
    assert s.device_bytes == 2 * MB and s.tier_of("a") == "device"


class SlowToFinish(NumpyCodec):
    """A codec whose values are still being computed for a while when a spill starts."""

    def ready(self, value) -> None:
        time.sleep(0.05)


def test_spill_seconds_time_the_copy_not_the_wait_for_the_value(below):
    s = TieredStore(device_limit=2 * MB, host_limit=64 * MB, codec=SlowToFinish(),
                    below=below())
    for i in range(6):
        s[i] = chunk(i)
    stats = s.summary()["stats"]
    assert stats["count"]["device_to_host"] == 4
    assert stats["producer_wait_s"] >= 4 * 0.05
    # four 1 MiB host copies, timed apart from the wait: the two are told apart, not summed
    assert stats["seconds"]["device_to_host"] < stats["producer_wait_s"], stats
    for i in range(6):
        np.testing.assert_array_equal(s[i], chunk(i))


def test_what_the_store_starts_runs_once_at_start_or_at_the_first_spill(below):
    # the pinned arena's growth makes a CUDA context: it waits for the worker to start
    started = []
    s = make(below, device_mb=2)
    s.on_start.append(lambda: started.append("arena"))
    s[0] = chunk(0)
    assert started == []  # building the store and storing under the limit start nothing
    s.start()
    s.start()
    assert started == ["arena"]
    lazy = make(below, device_mb=1)
    lazy.on_start.append(lambda: started.append("lazy"))
    lazy[0], lazy[1] = chunk(0), chunk(1)  # the second spills the first: no plugin started it
    assert started == ["arena", "lazy"] and lazy.tier_of(0) == "host"


# --- pageable buffers kept for reuse


def test_pageable_buffers_given_back_are_reused_by_size_within_the_cache():
    """A run past device and pinned memory spills buffers of the same sizes run after
    run: one given back is handed out again (no new host memory, no first touch), by
    size, while the kept bytes stay within the cache and count as held."""
    pageable = Recorder()
    host = HostBuffers(None, None, pageable=pageable, pageable_cache=3 * MB)
    a, b = host.alloc(2 * MB), host.alloc(MB)
    assert pageable.sizes == [2 * MB, MB] and host.held_bytes == 3 * MB
    host.release(a)
    host.release(b)
    assert host.kept_bytes == 3 * MB and host.pageable_bytes == 0 and host.held_bytes == 3 * MB
    again = host.alloc(2 * MB)
    assert again is a and pageable.sizes == [2 * MB, MB]  # reused, nothing new taken
    assert host.kept_bytes == MB and host.pageable_bytes == 2 * MB
    other = host.alloc(3 * MB)  # no kept buffer of that size: a new one
    assert pageable.sizes[-1] == 3 * MB
    host.release(other)  # 1 + 3 > 3 kept: this one goes back to the host
    assert host.kept_bytes == MB
    host.release(again)
    assert host.kept_bytes == 3 * MB and host.summary()["pageable_kept_bytes"] == 3 * MB


def test_a_kept_pageable_buffer_does_not_take_the_place_of_a_pinned_one():
    """Within the pinned limit a spill gets pinned memory (copies at the pinned rate);
    kept pageable buffers serve only past it."""
    pinned, pageable = Recorder(), Recorder()
    host = HostBuffers(None, pinned, pinned_limit=2 * MB, pageable=pageable, pageable_cache=8 * MB)
    first = host.alloc(2 * MB)  # pinned: within the limit
    spare = host.alloc(2 * MB)  # the limit is full: pageable
    host.release(spare)
    assert host.kept_bytes == 2 * MB
    host.release(first)  # the pinned limit has room again
    assert host.alloc(2 * MB) is not spare and pinned.sizes == [2 * MB, 2 * MB]
    assert host.alloc(2 * MB) is spare and len(pageable.sizes) == 1  # past the limit: reused


def test_kept_pageable_buffers_go_back_when_asked_and_when_idle():
    trims = []
    host = HostBuffers(None, None, pageable=Recorder(), pageable_cache=8 * MB, trim=lambda: trims.append(1))
    for buf in [host.alloc(MB) for _ in range(3)]:
        host.release(buf)
    assert host.kept_bytes == 3 * MB
    assert host.give_back() == 3 * MB and host.kept_bytes == 0 and host.held_bytes == 0 and trims == [1]
    old = host.alloc(MB)
    host.release(old)
    new = host.alloc(2 * MB)
    host.release(new)
    import time

    later = time.monotonic() + 10
    assert host.expire(60, now=later) == 0 and host.kept_bytes == 3 * MB
    assert host.expire(5, now=later) == 3 * MB and host.kept_bytes == 0


def test_kept_pageable_buffers_are_freed_outside_the_buffers_lock():
    """Unmapping what is given back can take seconds at tens of GB: every spill's alloc and
    release waits on the lock, so the buffers are freed after it is let go."""
    import weakref

    host = HostBuffers(None, None, pageable=Recorder(), pageable_cache=8 * MB)
    held_when_freed = []
    for _ in range(2):
        buffers = [host.alloc(MB) for _ in range(2)]
        for buf in buffers:
            weakref.finalize(buf, lambda: held_when_freed.append(host._lock.locked()))
            host.release(buf)
        del buffers, buf
        if not held_when_freed:
            assert host.give_back() == 2 * MB
        else:
            import time

            assert host.expire(0, now=time.monotonic() + 1) == 2 * MB
    assert held_when_freed == [False] * 4


def test_without_a_cache_pageable_buffers_go_straight_back():
    host = HostBuffers(None, None, pageable=Recorder())
    host.release(host.alloc(MB))
    assert host.kept_bytes == 0 and host.held_bytes == 0


def test_the_store_gives_kept_buffers_back_before_it_writes_to_disk(below):
    """The books short of room: kept pageable buffers go before any value is written."""
    from spillway.memory.books import HostBooks

    free = {"bytes": 64 * MB}
    books = HostBooks(lambda: free["bytes"], headroom=0)
    host = HostBuffers(None, None, pageable=Recorder(), pageable_cache=64 * MB)
    store = TieredStore(device_limit=4 * MB, host_limit=64 * MB, codec=NumpyCodec(), below=below(),
                        host=host, books=books)
    for i in range(8):
        store[f"x{i}"] = np.full(MB // 8, i, dtype=np.float64)  # 4 stay, 4 go to host
    for i in range(4, 8):
        del store[f"x{i}"]  # nothing: these are on the device
    for i in range(4):
        del store[f"x{i}"]  # their host buffers are kept
    kept = host.kept_bytes
    assert kept > 0
    free["bytes"] = 0  # the machine has no room: a new host buffer asks the books
    store._room_for_new_host_memory(MB)
    assert host.kept_bytes == 0


def test_peak_counts_every_tier_and_starts_again_on_reset(below):
    s = make(below, device_mb=2, host_mb=2)
    for i in range(6):
        s[i] = chunk(i)
    # six 1 MiB values: two on the device, two on the host, two below: all held at once
    assert s.held_bytes == 6 * MB and s.peak_bytes == 6 * MB
    for i in range(4):
        del s[i]
    assert s.held_bytes == 2 * MB and s.peak_bytes == 6 * MB
    assert s.reset_peak() == 2 * MB and s.summary()["peak_bytes"] == 2 * MB
    s[10] = chunk(10)
    s[4]  # a read moves values between tiers and holds nothing more
    assert s.peak_bytes == 3 * MB and s.summary()["held_bytes"] == 3 * MB
    s.close()


def test_spills_say_where_their_host_buffers_came_from(below):
    # a 2 MiB arena takes the first two spills; the third has no slice and takes a new buffer
    s = make(below, device_mb=1, host_mb=8, arena_mb=2)
    for i in range(4):
        s[i] = chunk(i)
    taken = s.host.summary()["taken_from"]
    assert taken["arena"] == 2 * MB and taken["pinned"] + taken["pageable"] == MB, taken
    assert s.stats.spill_alloc_s <= s.stats.seconds["device_to_host"]
    s.close()
