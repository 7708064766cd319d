"""Spill accounting by device buffers: what the store counts, what spill on demand may
evict and what it frees, with NumPy arrays in the device tier's place.

A buffer is one allocation; several stored values may view it (slices, the arrays of a
tuple that other keys also hold). The store counts each buffer once, moves the values that
share one together, and evicts whatever no running task is using, whoever else refers to
it (keys a client persisted, values waiting to be sent)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from distributed import Client, LocalCluster, get_worker, wait
from numpy_codec import NumpyCodec
from tier_stacks import lowered, raised

from spillway.memory.store import TieredStore

MB = 2**20


def chunk(i: int, n: int = MB // 8) -> np.ndarray:
    return np.random.default_rng(i).standard_normal(n)  # 1 MiB float64


def make(below, device_mb=8, host_mb=64, **kwargs):
    return TieredStore(device_limit=device_mb * MB, host_limit=host_mb * MB, codec=NumpyCodec(),
                       below=below(), **kwargs)


def test_a_buffer_viewed_by_several_keys_is_counted_once(below):
    s = make(below)
    base = chunk(0, n=MB // 4)  # 2 MiB
    s["base"] = base
    s["head"] = base[: MB // 8]  # a view: no new device memory
    s["rows"] = base.reshape(512, 512)[::2]  # a strided view of the same buffer
    assert s.device_bytes == 2 * MB
    assert s.summary()["device_buffers"] == 1


def test_tuple_values_are_device_values_and_share_with_their_items(below):
    # what a qr task returns, and the getitem tasks that take its items apart
    s = make(below)
    q, r = chunk(1), chunk(2, n=64)
    s["qr"] = (q, r)
    s["q"] = q
    s["r"] = r
    assert s.tier_of("qr") == "device"
    assert s.device_bytes == q.nbytes + r.nbytes


def test_keys_sharing_a_buffer_spill_together_and_free_it(below):
    s = make(below)
    base = chunk(0, n=MB // 4)
    s["base"], s["head"] = base, base[: MB // 8]
    s["other"] = chunk(1)
    freed = s.evict_for(2 * MB)
    # the buffer is free only when every key viewing it has left the device
    assert {s.tier_of(k) for k in ("base", "head")} == {"host"}
    assert freed >= 2 * MB and s.device_bytes == 3 * MB - freed
    head = s["head"]  # restores the whole group, still one buffer
    np.testing.assert_array_equal(head, base[: MB // 8])
    np.testing.assert_array_equal(s["base"], base)
    assert s.tier_of("base") == "device" and np.shares_memory(s["base"], s["head"])
    assert s.summary()["device_buffers"] == 2 or s.tier_of("other") == "host"


def test_values_held_outside_the_store_are_still_evicted(below):
    # a client persisted it, or a transfer is about to send it: neither is a running task,
    # and the store's accounting frees its buffer once the holder lets go
    s = make(below)
    for i in range(4):
        s[i] = chunk(i)
    waiting_to_be_sent = s[0]
    freed = s.evict_for(4 * MB)
    assert freed == 4 * MB and s.device_bytes == 0
    assert s.tier_of(0) == "host"
    np.testing.assert_array_equal(s[0], waiting_to_be_sent)


def test_inputs_of_running_tasks_are_not_evicted(below):
    running = {"in-use"}
    s = make(below, in_use=lambda: running)
    s["in-use"] = chunk(0)
    s["free"] = chunk(1)
    assert s.evict_for(2 * MB) == MB
    assert s.tier_of("in-use") == "device" and s.tier_of("free") == "host"
    assert s.evict_for(MB) == 0  # nothing more may go


def test_a_view_of_an_input_in_use_stays_with_it(below):
    running = {"x"}
    s = make(below, in_use=lambda: running)
    x = chunk(0)
    s["x"], s["slice"] = x, x[: x.size // 4]  # a quarter: kept as a view (see the next tests)
    assert s.evict_for(MB) == 0  # moving the slice would free nothing
    assert s.tier_of("slice") == "device"


def _qr_like(seed: int, rows: int = MB // 64, cols: int = 8):
    """What cupy.linalg.qr returns for a tall panel: Q in an allocation of its own, and R
    a view of the (panel-sized) workspace the factorisation ran in."""
    workspace = np.random.default_rng(seed).standard_normal((rows, cols))
    q = workspace * 2.0
    r = workspace[:cols]
    r[:] = np.triu(r)
    return q, r


def test_a_small_view_of_a_large_temporary_is_stored_as_its_own_bytes(below):
    s = make(below)
    q, r = _qr_like(0)
    s["qr"] = (q, r)
    s["r"] = s["qr"][1]
    s["q"] = s["qr"][0]
    # Q (1 MiB) and a copy of R's 512 bytes: not the 1 MiB workspace R viewed
    assert s.device_bytes == q.nbytes + r.nbytes
    np.testing.assert_array_equal(s["r"], r)
    assert np.shares_memory(s["r"], s["qr"][1])  # the item still shares with its tuple
    view = np.arange(MB // 4, dtype=np.float64)[:16]  # 128 bytes of a 2 MiB temporary
    s["v"] = view
    assert s.device_bytes == q.nbytes + r.nbytes + view.nbytes


def _qr_sharing_one_workspace(seed: int, rows: int = MB // 64, cols: int = 8):
    """Q and R both views of one panel-sized allocation (Q all of it, R its first rows)."""
    workspace = np.random.default_rng(seed).standard_normal((rows, cols))
    return workspace, workspace[:cols]


def test_tsqr_second_stage_reads_every_r_while_every_q_may_leave(below):
    # The H100's 108 GB svd: each first-stage tuple's R shared Q's allocation, so the
    # task reading every R held every Q on the device ("77 GiB in use by running tasks")
    running = set()
    s = make(below, device_mb=64, in_use=lambda: running)
    for i in range(4):
        s[("qr", i)] = _qr_sharing_one_workspace(i)
        s[("q", i)], s[("r", i)] = s[("qr", i)]
        del s[("qr", i)]
    running.update(("r", i) for i in range(4))
    assert s.evict_for(4 * MB) >= 4 * MB
    assert {s.tier_of(("q", i)) for i in range(4)} == {"host"}
    assert "(2.00 kiB in use by running tasks)" in s.exhausted(MB)
    for i in range(4):
        q, r = _qr_sharing_one_workspace(i)
        np.testing.assert_array_equal(s[("q", i)], q)
        np.testing.assert_array_equal(s[("r", i)], r)


def test_a_strided_r_spanning_its_whole_workspace_is_compacted(below):
    # cupy.linalg.qr of a tall panel: the workspace is the panel transposed (cols x rows,
    # C order) and R = workspace[:, :cols].T, 8 x 8 values strided across all of it
    running = set()
    s = make(below, device_mb=64, in_use=lambda: running)
    for i in range(4):
        workspace = np.random.default_rng(i).standard_normal((8, MB // 64))
        q = workspace.T * 2.0
        s[("qr", i)] = (q, workspace[:, :8].T)
        s[("q", i)], s[("r", i)] = s[("qr", i)]
        del s[("qr", i)]
    running.update(("r", i) for i in range(4))
    assert s.evict_for(4 * MB) >= 4 * MB
    assert "(2.00 kiB in use by running tasks)" in s.exhausted(MB), s.exhausted(MB)
    for i in range(4):
        workspace = np.random.default_rng(i).standard_normal((8, MB // 64))
        np.testing.assert_array_equal(s[("r", i)], workspace[:, :8].T)
        np.testing.assert_array_equal(s[("q", i)], workspace.T * 2.0)


def test_a_view_left_alone_on_a_large_allocation_is_compacted(below):
    s = make(below, device_mb=64)
    w = chunk(0)
    s["w"], s["quarter"] = w, w[: w.size // 4]  # a quarter of a stored array: a view
    assert s.device_bytes == MB
    del s["w"]  # now it holds 1 MiB for 256 KiB: stored again as its own bytes
    assert s.device_bytes == MB // 4
    np.testing.assert_array_equal(s["quarter"], chunk(0)[: w.size // 4])


def test_a_running_task_reading_r_lets_q_of_its_tuple_leave(below):
    # tsqr: the second stage reads every R; the Q of each first-stage tuple must be able
    # to leave the device meanwhile, though the tuple holds Q and R together
    running = set()
    s = make(below, device_mb=64, in_use=lambda: running)
    for i in range(4):
        q, r = _qr_like(i)
        s[("qr", i)] = (q, r)
        s[("q", i)], s[("r", i)] = s[("qr", i)]
    running.update(("r", i) for i in range(4))
    freed = s.evict_for(4 * MB)
    assert freed >= 4 * MB, (freed, {k: s.tier_of(k) for k in s})
    assert {s.tier_of(("r", i)) for i in range(4)} == {"device"}
    assert {s.tier_of(("q", i)) for i in range(4)} == {"host"}
    line = s.exhausted(MB)
    assert "(2.00 kiB in use by running tasks)" in line, line  # four R of 512 bytes
    for i in range(4):
        q, r = _qr_like(i)
        np.testing.assert_array_equal(s[("q", i)], q)
        np.testing.assert_array_equal(s[("qr", i)][0], q)
        np.testing.assert_array_equal(s[("qr", i)][1], r)


def test_spilled_groups_go_to_disk_and_back_with_their_views(below):
    s = make(below, device_mb=2, host_mb=2)
    bases = {i: chunk(i, n=MB // 8) for i in range(6)}
    for i, b in bases.items():
        s[("b", i)] = b
        s[("t", i)] = b.reshape(128, 1024).T  # F-ordered view
    assert s.below_bytes > 0
    for i, b in bases.items():
        np.testing.assert_array_equal(s[("t", i)], b.reshape(128, 1024).T)
        np.testing.assert_array_equal(s[("b", i)], b)
    for i in range(6):
        del s[("b", i)], s[("t", i)]
    assert len(s) == 0 and s.device_bytes == 0 and s.host_bytes == 0 and s.below_bytes == 0


def test_deleting_one_key_of_a_spilled_group_keeps_the_others(below):
    s = make(below)
    q, r = chunk(1), chunk(2, n=64)
    s["qr"], s["q"], s["r"] = (q, r), q, r
    s.evict_for(8 * MB)
    host = s.host_bytes
    del s["qr"], s["r"]
    assert s.host_bytes < host  # r's bytes went with the last key that viewed them
    np.testing.assert_array_equal(s["q"], q)
    # q is back on the device; its host buffer stays as a clean copy, holding nothing more
    assert s.device_bytes == q.nbytes and s.host_bytes == s.summary()["host_clean_bytes"] == q.nbytes
    assert s.held_bytes == q.nbytes


def test_nested_containers_round_trip(below):
    s = make(below)
    a, b = chunk(3), chunk(4, n=100)
    s["v"] = {"u": (a, [b, 7]), "name": "x"}
    s.evict_for(8 * MB)
    assert s.tier_of("v") == "host"
    v = s["v"]
    np.testing.assert_array_equal(v["u"][0], a)
    np.testing.assert_array_equal(v["u"][1][0], b)
    assert v["u"][1][1] == 7 and v["name"] == "x" and type(v["u"]) is tuple


def test_exhausted_names_the_worker_the_request_and_every_tier(below):
    s = make(below, device_mb=4, in_use=lambda: {0})
    s.name = "tcp://127.0.0.1:4000"
    for i in range(3):
        s[i] = chunk(i)
    s.evict_for(MB)
    line = s.exhausted(800 * MB)
    assert "\n" not in line
    for part in ("tcp://127.0.0.1:4000", "800.00 MiB", "device", "host", "disk", "in use"):
        assert part in line, line


# --- on a real worker: keys a client persisted are evicted for a running task


def _evict_inside_a_task(block, nbytes):
    store = get_worker().data
    return store.evict_for(nbytes), {k: store.tier_of(k) for k in list(store)}


@pytest.mark.timeout(120)
def test_persisted_keys_make_room_for_a_running_task(below):
    """A user persists chunks, then a task needs device memory: spill on demand evicts the
    persisted chunks that task does not read, never the one it reads."""
    import dask.array as da

    from spillway.launch.plugins import WorkerSetup

    store = TieredStore(device_limit=64 * MB, host_limit=256 * MB, codec=NumpyCodec(),
                        below=below())
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=None,
                      data=store) as cluster, Client(cluster) as client:
        client.register_plugin(WorkerSetup(prefetch=False))
        x = da.random.default_rng(0).random(8 * MB // 8, chunks=MB // 8).persist()
        wait(x)
        expected = float(x.sum().compute())
        assert store.device_bytes == 8 * MB
        blocks = client.futures_of(x)
        # asks for all 8 MiB: only the 7 that the running task does not read can go
        freed, tiers = client.submit(_evict_inside_a_task, blocks[0], 8 * MB, pure=False).result()
        assert freed == 7 * MB, (freed, tiers)
        assert tiers[blocks[0].key] == "device", tiers  # the running task reads it
        assert [tiers[b.key] for b in blocks[1:]] == ["host"] * 7, tiers
        assert float(x.sum().compute()) == expected


def _evict_reading_rs(*rs, nbytes):
    store = get_worker().data
    return store.evict_for(nbytes), {k: store.tier_of(k) for k in list(store)}, store.exhausted(nbytes)


@pytest.mark.timeout(120)
def test_a_task_reading_the_r_of_qr_tuples_lets_their_q_leave(below):
    """tsqr's second stage on a real worker: a task reads the R of every first-stage
    (Q, R) tuple; spill on demand moves the tuples and their Q to host, and counts as in
    use only the bytes of the R it reads."""
    import operator

    from spillway.launch.plugins import WorkerSetup

    store = TieredStore(device_limit=64 * MB, host_limit=256 * MB, codec=NumpyCodec(),
                        below=below())
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=None,
                      data=store) as cluster, Client(cluster) as client:
        client.register_plugin(WorkerSetup(prefetch=False))
        tuples = [client.submit(_qr_like, i, pure=False) for i in range(4)]
        qs = [client.submit(operator.getitem, t, 0) for t in tuples]
        rs = [client.submit(operator.getitem, t, 1) for t in tuples]
        wait(qs + rs)
        assert store.device_bytes == 4 * (MB + 512)  # each R stored as its own 512 bytes
        freed, tiers, line = client.submit(_evict_reading_rs, *rs, nbytes=4 * MB, pure=False).result()
        assert freed == 4 * MB, (freed, tiers)
        assert {tiers[r.key] for r in rs} == {"device"}, tiers
        assert {tiers[q.key] for q in qs} == {"host"}, tiers
        assert "(2.00 kiB in use by running tasks)" in line, line
        for i, (q, r) in enumerate(zip(client.gather(qs), client.gather(rs))):
            expected_q, expected_r = _qr_like(i)
            np.testing.assert_array_equal(q, expected_q)
            np.testing.assert_array_equal(r, expected_r)


@pytest.mark.timeout(120)
def test_data_a_client_scattered_and_still_holds_is_evicted(below):
    """In-process, scattered arrays are the client's own objects: referred to from outside
    the store, yet no task is using them, so they leave the device when a task needs room."""
    from spillway.launch.plugins import WorkerSetup

    store = TieredStore(device_limit=64 * MB, host_limit=256 * MB, codec=NumpyCodec(),
                        below=below())
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=None,
                      data=store) as cluster, Client(cluster) as client:
        client.register_plugin(WorkerSetup(prefetch=False))
        mine = [chunk(i) for i in range(4)]
        scattered = client.scatter(mine)
        wait(scattered)
        assert store.device_bytes == 4 * MB
        freed, tiers = client.submit(_evict_inside_a_task, None, 4 * MB, pure=False).result()
        assert freed == 4 * MB and [tiers[f.key] for f in scattered] == ["host"] * 4, tiers
        back = client.gather(scattered)
        assert all(np.array_equal(a, b) for a, b in zip(back, mine))


def test_a_failed_allocation_fails_its_task_with_the_store_s_line(below):
    from spillway.options.errors import DeviceMemoryExhausted
    from spillway.launch.plugins import explained

    s = make(below, device_mb=2, in_use=lambda: {0, 1})
    s.name = "worker 0 (tcp://127.0.0.1:4000)"
    s[0], s[1] = chunk(0), chunk(1)

    def pool_exceeded(nbytes):
        raise MemoryError("std::bad_alloc: out_of_memory: RMM failure: Maximum pool size exceeded")

    with pytest.raises(DeviceMemoryExhausted) as info:
        explained(pool_exceeded, s)(800 * MB)
    message = str(info.value)
    assert message.startswith("worker 0 (tcp://127.0.0.1:4000): cannot allocate 800.00 MiB")
    assert "device 2.00 MiB stored (2.00 MiB in use by running tasks)" in message
    assert isinstance(info.value, MemoryError)


def test_stress_views_tuples_and_evictions_every_value_checked(below):
    from spillway.memory.arena import Arena
    from spillway.memory.host import HostBuffers

    s = TieredStore(device_limit=3 * MB, host_limit=4 * MB, codec=NumpyCodec(),
                    below=below(), host=HostBuffers(Arena(np.empty(3 * MB, dtype=np.uint8))))
    rng = np.random.default_rng(1)
    live = {}
    for step in range(500):
        op, key = int(rng.integers(0, 12)), int(rng.integers(0, 30))
        if op < 3:
            live[key] = chunk(step, n=int(rng.integers(1, MB // 8)))
            s[key] = live[key]
        elif op < 5 and live:
            # a view of another stored value, or a tuple holding it: shares its buffer
            other = list(live)[int(rng.integers(0, len(live)))]
            base = s[other]
            if isinstance(base, tuple):
                base = base[0]
            value = base[::2] if op == 3 else (base, base[: len(base) // 3])
            s[key] = live[key] = value
        elif op < 8 and key in live:
            _assert_same(s[key], live[key])
        elif op < 9 and key in live:
            del s[key], live[key]
        elif op < 10:
            s.evict_for(int(rng.integers(1, 3 * MB)))
        else:
            s.prefetch(s.spilled(live)[:3])
    for key, value in live.items():
        _assert_same(s[key], value)
    moved = s.stats.bytes
    assert moved["device_to_host"] and moved[lowered(s)] and raised(s) and s.stats.prefetched_bytes
    for key in list(live):
        del s[key]
    assert s.device_bytes == 0 and s.host_bytes == 0 and s.below_bytes == 0
    assert s.host.arena.used_bytes == 0


def _assert_same(got, expected):
    if isinstance(expected, tuple):
        assert type(got) is tuple and len(got) == len(expected)
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g, e)
    else:
        np.testing.assert_array_equal(got, expected)


@pytest.mark.timeout(120)
def test_a_worker_gives_kept_pageable_buffers_back_once_spills_stop(below, monkeypatch):
    """On a real worker with host books: kept pageable buffers go back to the host on
    the worker's own clock once none was reused for KEPT_IDLE_S."""
    from spillway.launch import plugins
    from spillway.launch.plugins import WorkerSetup
    from spillway.memory.books import HostBooks
    from spillway.memory.host import HostBuffers

    monkeypatch.setattr(plugins, "KEPT_IDLE_S", 0.2)
    host = HostBuffers(None, None, pageable_cache=64 * MB)
    store = TieredStore(device_limit=4 * MB, host_limit=64 * MB, codec=NumpyCodec(), below=below(), host=host,
                        books=HostBooks(lambda: 2**40, headroom=0))
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=None,
                      data=store) as cluster, Client(cluster) as client:
        client.register_plugin(WorkerSetup(prefetch=False))
        assert client.run(lambda dask_worker: "spillway-host-kept" in dask_worker.periodic_callbacks) \
            == {a: True for a in cluster.scheduler.workers}
        for i in range(8):
            store[f"x{i}"] = np.full(MB // 8, i, dtype=np.float64)
        for i in range(8):
            del store[f"x{i}"]
        assert host.kept_bytes > 0
        deadline = time.monotonic() + 10
        while host.kept_bytes and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host.kept_bytes == 0 and host.held_bytes == 0
