"""The collective rechunk (spillway.datapath.collective): its plan from the chunk grids, its
values bit for bit against dask's task-based rechunk for odd grids, on dask's local
scheduler and on real workers (over TCP here; over UCXX's TCP transport with the data
plane in test_collective_ucx.py; CuPy pieces between GPUs in test_collective_gpu.py), a
task a chunk, the assemblies spread over the workers, nothing left behind, and a worker
killed mid-exchange."""

from __future__ import annotations

import os
import signal
import time

import dask
import dask.array as da
import numpy as np
import pytest

from spillway.datapath.collective import CollectiveLost, CollectivePlacement, ExchangePlan, rechunk
from spillway.datapath.collective.plan import axis_overlaps, axis_runs

GRIDS = [
    # (shape, input chunks, output chunks)
    ((37, 53), (5, 53), (37, 4)),                 # row panels to column panels
    ((37, 53), (5, 53), (7, 11)),                 # to an odd grid
    ((37, 53), (6, 9), ((10, 27), (20, 33))),     # uneven chunks out
    ((40, 30), (10, 10), (40, 6)),                # partials: split at shared boundaries
    ((8, 9, 10), (3, 9, 2), (8, 2, 5)),           # three axes
    ((12, 7), ((4, 0, 8), (7,)), (12, 2)),        # an empty chunk in
    ((1, 17), (1, 3), (1, 5)),                    # one row
]


def _array(shape, chunks, seed=0):
    return da.random.default_rng(seed).random(shape, chunks=chunks)


# --- the plan


def test_overlaps_cover_each_axis_exactly_once():
    old, new = (3, 0, 4, 5), (2, 6, 4)
    covered = np.zeros(12, dtype=int)
    bounds_old, bounds_new = np.cumsum((0,) + old), np.cumsum((0,) + new)
    for a, overlaps in enumerate(axis_overlaps(old, new)):
        for b, src, dst in overlaps:
            assert src.stop - src.start == dst.stop - dst.start
            assert bounds_old[a] + src.start == bounds_new[b] + dst.start
            covered[bounds_old[a] + src.start: bounds_old[a] + src.stop] += 1
    assert (covered == 1).all()


def test_runs_split_at_shared_boundaries():
    assert axis_runs((10, 10, 10), (5, 25)) == [(range(0, 3), range(0, 2))]
    assert axis_runs((10, 10, 10), (5, 15, 10)) == [(range(0, 2), range(0, 2)), (range(2, 3), range(2, 3))]
    # every index in exactly one run, empty chunks included
    runs = axis_runs((4, 0, 4, 0), (2, 2, 4))
    assert sorted(i for o, _ in runs for i in o) == [0, 1, 2, 3]
    assert sorted(j for _, n in runs for j in n) == [0, 1, 2]


def test_a_panel_rechunk_is_one_partial_with_a_task_a_chunk():
    plan = ExchangePlan(((10,) * 8, (80,)), ((80,), (10,) * 8))
    assert len(plan.partials) == 1 and plan.exchanges
    assert plan.pieces() == 64  # what the tasks method makes a task of, each
    assert plan.tasks() == 8 + 8 + 1
    # a split along one axis and a merge along the other are independent exchanges
    plan = ExchangePlan(((10,) * 4, (20, 20)), ((40,), (5,) * 8))
    assert len(plan.partials) == 2 and all(p.exchanges for p in plan.partials)


def test_a_rechunk_that_only_splits_or_merges_is_dask_s_own():
    x = _array((40, 40), (10, 40))
    assert not any(name.startswith(("spillway-cut-", "spillway-step-")) for name in rechunk(x, (20, 40)).dask.layers)
    assert not any(name.startswith(("spillway-cut-", "spillway-step-")) for name in rechunk(x, (5, 40)).dask.layers)
    assert rechunk(x, x.chunks) is x


# --- values, dask's local scheduler


@pytest.mark.parametrize("shape, chunks, new", GRIDS)
def test_values_equal_the_tasks_method_bit_for_bit(shape, chunks, new):
    x = _array(shape, chunks, seed=len(shape))
    y = rechunk(x, new)
    want = x.rechunk(new, method="tasks")
    assert y.chunks == want.chunks
    assert np.array_equal(y.compute(scheduler="sync"), want.compute(scheduler="sync"))
    assert np.array_equal(y.compute(scheduler="threads"), want.compute(scheduler="sync"))


# --- real workers


@pytest.fixture(scope="module")
def client(collective_client):
    return collective_client


def _pieces_left(dask_worker=None) -> int:
    return sum(1 for k in dask_worker.data if type(k) is tuple and str(k[0]).startswith("spillway-pieces-"))


@pytest.mark.parametrize("shape, chunks, new", GRIDS)
def test_real_workers_give_the_same_bits_and_keep_no_piece(client, shape, chunks, new):
    x = _array(shape, chunks, seed=3).persist()
    want = x.rechunk(new, method="tasks").compute()
    assert np.array_equal(client.compute(rechunk(x, new)).result(timeout=60), want)
    deadline = time.monotonic() + 10
    while sum(client.run(_pieces_left).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sum(client.run(_pieces_left).values()) == 0


def _taken_key_lengths(dask_worker=None) -> list:
    return sorted({len(k) for e in dask_worker.transfer_incoming_log for k in e["keys"]
                   if type(k) is tuple and str(k[0]).startswith("spillway-pieces-")})


@pytest.fixture
def pieces_only(client):
    """The scheduler's plugin told that no exchange fits: every piece a value of its own
    (what an exchange larger than the devices does)."""
    from spillway.datapath.collective import PLUGIN_NAME

    client.unregister_scheduler_plugin(PLUGIN_NAME)
    client.register_plugin(CollectivePlacement(fit_fraction=0.0))
    yield client
    client.unregister_scheduler_plugin(PLUGIN_NAME)
    client.register_plugin(CollectivePlacement())


@pytest.mark.parametrize("shape, chunks, new", GRIDS[:5])
def test_an_exchange_too_large_to_group_moves_pieces_with_the_same_bits(pieces_only, shape, chunks, new):
    client = pieces_only
    client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())
    x = _array(shape, chunks, seed=4).persist()
    want = x.rechunk(new, method="tasks").compute()
    assert np.array_equal(client.compute(rechunk(x, new)).result(timeout=60), want)
    lengths = {n for found in client.run(_taken_key_lengths).values() for n in found}
    assert lengths <= {3}, lengths  # (pieces, input, output): no packed buffer moved


def test_a_grouped_exchange_moves_one_buffer_an_input_and_worker(client):
    client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())
    x = _array((300, 300), (25, 300), seed=6).persist()
    assert np.array_equal(client.compute(rechunk(x, (300, 25))).result(timeout=60), x.compute())
    lengths = {n for found in client.run(_taken_key_lengths).values() for n in found}
    assert lengths == {4}, lengths  # (pieces, "g", input, worker)


def test_a_rechunk_that_would_not_fit_the_fastest_tier_takes_dask_s_task_method(client):
    from spillway.datapath.collective.way import COLLECTIVE, TASKS, cluster_room, way

    assert way(100, None) == COLLECTIVE and way(100, {"held": 0, "fastest": 0}) == COLLECTIVE
    assert way(130, {"held": 50, "fastest": 200}) == COLLECTIVE
    assert way(131, {"held": 50, "fastest": 200}) == TASKS
    # two H200s' device tiers (241.2 GB): the 200 GB rechunk alone takes the collective; the
    # user's FFT's 160 GB exchange beside its 80 GB field does not
    assert way(200e9, {"held": 0, "fastest": 241.2e9}) == COLLECTIVE
    assert way(160e9, {"held": 80e9, "fastest": 241.2e9}) == TASKS
    from distributed import wait

    x = _array((300, 200), (25, 200), seed=12).persist()
    wait(x)
    room = cluster_room()  # the plugin's answer: what the workers hold, their memory limits
    limits = sum(w["memory_limit"] for w in client.scheduler_info()["workers"].values())
    assert room["fastest"] == limits and room["held"] >= x.nbytes and room["workers"] == 3
    fits = rechunk(x, (300, 20))
    assert any(name.startswith(("spillway-cut-", "spillway-step-")) for name in fits.dask.layers)
    # the exchange's 480 KB beside what the cluster holds pass 9/10 of a fastest tier of 1 MB
    past = rechunk(x, (300, 20), room={"held": room["held"], "fastest": 1_000_000})
    assert not any(name.startswith("spillway-") for name in past.dask.layers)
    assert np.array_equal(past.compute(), x.compute()) and np.array_equal(fits.compute(), x.compute())


def test_assemblies_are_spread_over_the_workers(client):
    from distributed import futures_of, wait

    x = _array((600, 600), (50, 600), seed=5).persist()
    y = rechunk(x, (600, 50)).persist()
    wait(y)
    holders = client.who_has(y)
    per_worker: dict = {}
    for key, workers in holders.items():
        for w in workers:
            per_worker[w] = per_worker.get(w, 0) + 1
    # 12 output panels on 3 workers: 4 each (dask alone would assemble all 12 where the
    # barrier ran)
    assert sorted(per_worker.values()) == [4, 4, 4], per_worker
    assert len(futures_of(y)) == 12
    assert np.array_equal(y.compute(), x.compute())


def test_a_user_s_rechunk_is_routed_to_the_collective_on_a_spillway_scheduler(client):
    from spillway.datapath.collective import method

    x = _array((300, 200), (25, 200), seed=9).persist()
    with dask.config.set({"array.rechunk.method": "p2p"}):
        method.use_on(client)
        try:
            y = x.rechunk((300, 20))
            assert any(name.startswith(("spillway-cut-", "spillway-step-")) for name in y.dask.layers)
        finally:
            method.stop_using(client)
        # once the session stops, its rechunks are dask's P2P again
        z = x.rechunk((300, 20))
        assert not any(name.startswith(("spillway-cut-", "spillway-step-")) for name in z.dask.layers)
    assert np.array_equal(y.compute(), x.compute())



def _routed(x):
    return any(name.startswith(("spillway-cut-", "spillway-step-")) for name in x.dask.layers)


def test_another_client_of_a_session_s_cluster_is_routed_and_none_after_the_session_closes(client):
    """The route follows the session's cluster, not an address once seen: a second client
    the user opens to its scheduler takes the collective; once the session's client has
    closed, a client of its scheduler keeps dask's P2P even before ``stop_using``, and the
    last ``stop_using`` puts dask's own names back."""
    import distributed.shuffle
    from distributed import Client

    from spillway.datapath.collective import method

    own = distributed.shuffle.rechunk_p2p
    x = _array((300, 200), (25, 200), seed=3)
    with dask.config.set({"array.rechunk.method": "p2p"}):
        session = Client(client.scheduler.address, set_as_default=False)
        method.use_on(session)
        try:
            assert distributed.shuffle.rechunk_p2p is method.rechunk_p2p
            with client.as_current():
                y = x.rechunk((300, 20))
            assert _routed(y)
            assert np.array_equal(client.compute(y).result(timeout=60), x.compute(scheduler="sync"))
            session.close()
            with client.as_current():
                assert not _routed(x.rechunk((300, 20)))
        finally:
            method.stop_using(session)
            session.close()
    assert distributed.shuffle.rechunk_p2p is own

def _slow(block):
    time.sleep(0.4)
    return block


def test_a_worker_killed_mid_exchange_fails_the_computation_in_one_line_or_recovers(client):
    x = _array((900, 900), (50, 900), seed=11).persist()
    want = x.compute()
    y = rechunk(x, (900, 50)).map_blocks(_slow, dtype=x.dtype)
    future = client.compute(y)
    # once some outputs are assembled (and slept on), the cuts are done and pieces sit on every worker
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = client.run_on_scheduler(_in_memory, y.name)
        if states >= 3:
            break
        time.sleep(0.05)
    pids = client.run(os.getpid)
    victim = sorted(pids)[0]
    print("assembled before the kill:", states, flush=True)
    os.kill(pids[victim], signal.SIGKILL)
    try:
        # the outcome, not how fast it came: a computation left hanging fails this wait
        got = future.result(timeout=120)
    except CollectiveLost as e:
        text = str(e)
        assert "\n" not in text and "cannot get" in text and "lost mid-exchange" in text, text
        print(f"failed: {text}")
    else:
        # the exchange was made again (its barrier and cuts recomputed): the values hold
        assert np.array_equal(got, want)
        print("recovered")
    # the held array is still whole
    client.wait_for_workers(3, timeout=60)
    assert np.array_equal(x.compute(), want)


def _in_memory(name, dask_scheduler=None) -> int:
    return sum(1 for ts in dask_scheduler.tasks.values()
               if isinstance(ts.key, tuple) and ts.key[0] == name and ts.state == "memory")


def test_the_capacity_check_counts_each_cut_as_its_input_chunk():
    from dask._expr import HLGExpr

    from spillway.memory.graph_bytes import graph_bytes

    x = _array((400, 300), (50, 300), seed=2)
    y = rechunk(x, (400, 30))
    dsk = dict(y.__dask_graph__())
    sizes = graph_bytes(HLGExpr(y.__dask_graph__()), dsk)
    cuts = {k: v for k, v in sizes.items() if str(k[0]).startswith("spillway-cut-")}
    outputs = {k: v for k, v in sizes.items() if k[0] == y.name}
    # the pieces a cut keeps are its input chunk's bytes; each output chunk its own
    assert len(cuts) == 8 and set(cuts.values()) == {50 * 300 * 8}
    assert len(outputs) == 10 and set(outputs.values()) == {400 * 30 * 8}


def test_assemblies_after_the_first_read_their_buffers_off_the_event_loop():
    """Once a grouped exchange's buffers are in the owner's tiered store, an assembly reads
    its pieces there from its own thread (no trip through the event loop); a buffer not
    there yet, or a store of another kind, sends it back to the loop's path."""
    from types import SimpleNamespace

    from numpy_codec import NumpyCodec

    from spillway.datapath.collective.copies import view_of
    from spillway.datapath.collective.exchange import _owned_on_device
    from spillway.datapath.collective.layout import PieceLayout, flat_index, packing, plan_of
    from spillway.memory.store import TieredStore

    old, new = ((2, 2, 2), (6,)), ((6,), (3, 3))
    plan = plan_of(old, new)
    x = np.arange(36.0).reshape(6, 6)
    store = TieredStore(device_limit=1 << 20, host_limit=1 << 20, codec=NumpyCodec())
    worker = SimpleNamespace(address="b", data=store)
    layout = PieceLayout(("a", "b"), True)
    for i in plan.partials[0].inputs:
        block = x[2 * i[0]: 2 * i[0] + 2]
        total, pieces = packing(old, new, i, 2)[1]
        buffer = np.empty(total)
        for offset, shape, src in pieces.values():
            buffer[offset: offset + int(np.prod(shape))] = block[src].ravel()
        store[("n", "g", flat_index(i, (3, 1)), 1)] = buffer
    found = _owned_on_device(worker, "n", (0, 1), old, new, layout)
    got = np.empty((6, 3))
    for i, place in plan.parts_of((0, 1)):
        got[place] = view_of(*found[i])
    np.testing.assert_array_equal(got, x[:, 3:])
    del store[("n", "g", 2, 1)]
    assert _owned_on_device(worker, "n", (0, 1), old, new, layout) is None
    assert _owned_on_device(SimpleNamespace(address="b", data={}), "n", (0, 1), old, new, layout) is None


# --- what an exchange keeps on a worker


def test_a_local_scheduler_s_exchange_leaves_no_run_behind():
    from spillway.datapath.collective.state import LOCAL

    x = _array((40, 30), (10, 30), seed=13)
    y = rechunk(x, (40, 6))
    for scheduler in ("sync", "threads"):
        assert np.array_equal(y.compute(scheduler=scheduler), x.compute(scheduler="sync"))
        assert not [n for n in LOCAL.names() if n.startswith("spillway-pieces-")], LOCAL.names()


def _runs(dask_worker=None) -> list | None:
    from spillway.datapath.collective.state import state_of

    state = state_of(dask_worker)
    return None if state is None else state.names()


def test_an_exchange_s_run_goes_with_its_drop_and_every_run_with_the_worker():
    """A worker's state of an exchange (its run: layout, first-assembly lock) is made by
    its cut and dropped when the scheduler says the exchange ended; the worker's plugin
    drops what is left when the worker closes."""
    from dask.delayed import Delayed
    from distributed import Client, LocalCluster

    from spillway.datapath.collective.names import is_barrier, pieces_name
    from spillway.datapath.collective.state import WORKER_PLUGIN

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as c:
        c.register_plugin(CollectivePlacement())
        x = _array((40, 30), (10, 30), seed=14).persist()
        y = rechunk(x, (40, 6))
        barrier_key = next(k for k in dict(y.dask) if is_barrier(k))
        name = pieces_name(barrier_key)
        # the barrier held (its future kept): the exchange has not ended
        held = c.compute(Delayed(barrier_key, y.dask, layer=barrier_key[0]))
        cutters = set(held.result(timeout=60)["holders"].values())
        assert all(name in c.run(_runs)[w] for w in cutters)
        del held  # released: the scheduler's plugin tells the holders to drop it
        deadline = time.monotonic() + 10
        while any(name in (r or ()) for r in c.run(_runs).values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(name in (r or ()) for r in c.run(_runs).values())
        # an exchange held when the worker closes: its run goes with the worker's plugin
        held = c.compute(Delayed(barrier_key, y.dask, layer=barrier_key[0]))
        cutters = set(held.result(timeout=60)["holders"].values())
        workers = [w for w in cluster.workers.values() if w.address in cutters]
        plugins = [w.plugins[WORKER_PLUGIN] for w in workers]
        assert all(name in p.state.names() for p in plugins)
        assert np.array_equal(c.compute(y).result(timeout=60), x.compute())
    assert all(p.state.names() == [] for p in plugins)
    assert all(WORKER_PLUGIN not in w.plugins for w in workers)
