"""A map_overlap's halos as one exchange (spillway.datapath.collective.graph.overlap_internal):
the windows and their plan from the chunk grid, every grown block bit for bit against
dask's own ``overlap_internal`` for odd grids and depths, on dask's local scheduler and on
real workers, a task a chunk, and a user's own ``map_overlap`` routed to it on a spillway
scheduler (its boundaries, trim and function dask's own)."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from dask.array.overlap import overlap_internal as dask_overlap_internal

from spillway.datapath.collective import ExchangePlan
from spillway.datapath.collective.graph import overlap_internal, overlap_windows
from spillway.datapath.collective.plan import axis_window_runs
from stand_ins import OtherSession

HALOS = [
    # (shape, chunks, axes: depth per axis, an int or (left, right))
    ((40, 30), (10, 10), {0: 2, 1: 3}),
    ((37, 53), (6, 9), {0: 1}),                      # one axis only: the other's chunks stay apart
    ((37, 53), ((10, 27), (20, 33)), {0: (3, 1), 1: (0, 4)}),  # uneven chunks, one-sided depths
    ((8, 9, 10), (3, 3, 4), {0: 1, 1: 1, 2: 1}),     # three axes: faces, edges and corners
    ((1, 17), (1, 3), {1: 2}),                       # an axis of one chunk
    ((12, 12), (4, 4), {0: 4, 1: 4}),                # depth a whole chunk
]


def _array(shape, chunks, seed=0):
    return da.random.default_rng(seed).random(shape, chunks=chunks)


# --- the windows and their plan


@pytest.mark.parametrize("shape, chunks, axes", HALOS)
def test_the_windows_are_the_grown_chunks_dask_makes(shape, chunks, axes):
    x = _array(shape, chunks)
    want = dask_overlap_internal(x, axes).chunks
    windows = overlap_windows(x.chunks, axes)
    assert tuple(tuple(b - a for a, b in axis) for axis in windows) == want
    plan = ExchangePlan(x.chunks, windows)
    assert plan.sizes == want
    # every output element is written by exactly one piece
    for index in np.ndindex(*map(len, want)):
        filled = np.zeros(plan.output_shape(index), dtype=int)
        for _, dst in plan.parts_of(index):
            filled[dst] += 1
        assert (filled == 1).all(), index


def test_an_axis_without_depth_keeps_its_chunks_apart():
    windows = overlap_windows(((10, 10, 10), (5, 5)), {0: 2})
    assert windows == (((0, 12), (8, 22), (18, 30)), ((0, 5), (5, 10)))
    assert axis_window_runs((5, 5), windows[1]) == [((0,), (0,)), ((1,), (1,))]
    assert axis_window_runs((10, 10, 10), windows[0]) == [((0, 1, 2), (0, 1, 2))]
    plan = ExchangePlan(((10, 10, 10), (5, 5)), windows)
    assert len(plan.partials) == 2 and all(p.exchanges for p in plan.partials)


# --- the values


@pytest.mark.parametrize("shape, chunks, axes", HALOS)
def test_grown_blocks_equal_dask_s_bit_for_bit(shape, chunks, axes):
    x = _array(shape, chunks, seed=1)
    want = dask_overlap_internal(x, axes)
    got = overlap_internal(x, axes, room=None, fallback=dask_overlap_internal)
    assert got.chunks == want.chunks
    if ExchangePlan(x.chunks, overlap_windows(x.chunks, axes)).exchanges:
        assert any(name.startswith(("spillway-cut-", "spillway-step-")) for name in got.dask.layers)
    for scheduler in ("sync", "threads"):
        assert np.array_equal(got.compute(scheduler=scheduler), want.compute(scheduler="sync"))


@pytest.mark.parametrize("way, tasks", [("step", 1 + 64), ("pieces", 64 + 1 + 64)])
def test_a_task_a_chunk_where_dask_makes_one_a_face_edge_and_corner(routed, way, tasks):
    import dask

    x = _array((64, 64, 64), (16, 16, 16))
    axes = {0: 1, 1: 1, 2: 1}
    with dask.config.set({"spillway.exchange": way}):
        ours = overlap_internal(x, axes, room=None, fallback=dask_overlap_internal)
    theirs = dask_overlap_internal(x, axes)
    n = len(x.__dask_graph__())
    ours_tasks, theirs_tasks = len(ours.__dask_graph__()) - n, len(theirs.__dask_graph__()) - n
    # one step (no cluster: one slot) and a getter a chunk; or a cut a chunk, one barrier
    # and an assembly a chunk
    assert ours_tasks == tasks
    assert theirs_tasks > 4 * ours_tasks, (ours_tasks, theirs_tasks)


def test_halos_that_would_not_fit_the_fastest_tier_are_dask_s_own():
    x = _array((40, 30), (10, 10))
    y = overlap_internal(x, {0: 1, 1: 1}, room={"held": 0, "fastest": 100}, fallback=dask_overlap_internal)
    assert not any(name.startswith(("spillway-cut-", "spillway-step-")) for name in y.dask.layers)
    assert np.array_equal(y.compute(), dask_overlap_internal(x, {0: 1, 1: 1}).compute())


# --- real workers, and a user's own map_overlap


@pytest.fixture(scope="module")
def client(collective_client):
    return collective_client


def test_a_persisted_field_counts_as_held_though_the_scheduler_holds_none_of_it_yet(client):
    # a field persisted and filtered at once (its chunks still being made): the exchange's
    # pieces alone fit 9/10 of the fastest tier, the pieces beside the field do not; a
    # field made in the graph goes as it is cut, and takes the exchange
    lazy = _array((40, 30), (10, 10))  # 9,600 bytes of float64, every chunk exchanging
    field = client.persist(lazy)
    room = {"held": 0, "fastest": 12_000}
    past = overlap_internal(field, {0: 1, 1: 1}, room=room, fallback=dask_overlap_internal)
    assert not any(name.startswith(("spillway-cut-", "spillway-step-")) for name in past.dask.layers)
    made = overlap_internal(lazy, {0: 1, 1: 1}, room=room, fallback=dask_overlap_internal)
    assert any(name.startswith(("spillway-cut-", "spillway-step-")) for name in made.dask.layers)
    assert np.array_equal(past.compute(), made.compute())
    # a user's map_overlap with a boundary: the halos see the field padded (an array made
    # from the persisted one), and weigh it as held all the same
    padded = da.overlap.boundaries(field, {0: 1, 1: 1}, {0: 0, 1: 0})
    assert padded.name != field.name and len(padded.dask.layers) > 1
    grown = overlap_internal(padded, {0: 1, 1: 1}, room=room, fallback=dask_overlap_internal)
    assert not any(name.startswith(("spillway-cut-", "spillway-step-")) for name in grown.dask.layers)


@pytest.mark.parametrize("shape, chunks, axes", HALOS[:4])
def test_real_workers_grow_the_same_blocks(client, shape, chunks, axes):
    x = _array(shape, chunks, seed=4).persist()
    want = dask_overlap_internal(x, axes).compute()
    grown = overlap_internal(x, axes, room=None, fallback=dask_overlap_internal)
    assert np.array_equal(client.compute(grown).result(timeout=60), want)


def _laplacian(block):
    out = -6 * block
    for axis in range(block.ndim):
        out = out + np.roll(block, 1, axis) + np.roll(block, -1, axis)
    return out


@pytest.mark.parametrize("boundary", ["none", "reflect", "periodic", "nearest", 0.5])
def test_a_user_s_map_overlap_is_routed_to_the_exchange_with_dask_s_bits(client, boundary):
    from spillway.datapath.collective import method

    x = _array((48, 40, 36), (12, 10, 12), seed=5).persist()
    want = client.compute(x.map_overlap(_laplacian, depth=1, boundary=boundary)).result(timeout=60)
    method.use_on(client)
    try:
        y = x.map_overlap(_laplacian, depth=1, boundary=boundary)
        assert any(name.startswith(("spillway-cut-", "spillway-step-")) for name in y.dask.layers)
        got = client.compute(y).result(timeout=60)
    finally:
        method.stop_using(client)
    assert np.array_equal(got, want)
    # once the session stops, its map_overlaps are dask's own again
    z = x.map_overlap(_laplacian, depth=1, boundary=boundary)
    assert not any(name.startswith(("spillway-cut-", "spillway-step-")) for name in z.dask.layers)


def test_without_a_spillway_scheduler_a_map_overlap_is_dask_s_own_even_routed(client):
    """The route is in place while a spillway session is open in the process; a client of
    another scheduler (or none) keeps dask's tasks."""
    from spillway.datapath.collective import method

    other = OtherSession("tcp://127.0.0.1:1")  # a spillway session that is not this client's
    method.use_on(other)
    try:
        x = _array((20, 20), (5, 5))
        y = x.map_overlap(lambda b: b * 2, depth=1, boundary="none")
        assert not any(name.startswith(("spillway-cut-", "spillway-step-")) for name in y.dask.layers)
        assert np.array_equal(client.compute(y).result(timeout=60), (x * 2).compute(scheduler="sync"))
    finally:
        method.stop_using(other)


def test_masked_chunks_keep_dask_s_way_and_their_mask():
    from spillway.datapath.collective import rechunk

    data = np.arange(400.0).reshape(20, 20)
    x = da.ma.masked_greater(da.from_array(data, chunks=(5, 20)), 300)
    grown = overlap_internal(x, {0: 1, 1: 0}, room=None, fallback=dask_overlap_internal)
    assert not any(name.startswith(("spillway-cut-", "spillway-step-")) for name in grown.dask.layers)
    got = grown.compute(scheduler="sync")
    assert np.ma.isMaskedArray(got) and got.mask.sum() == dask_overlap_internal(x, {0: 1, 1: 0}).compute().mask.sum()
    y = rechunk(x, (20, 5), room=None)
    assert not any(name.startswith(("spillway-cut-", "spillway-step-")) for name in y.dask.layers)
    assert np.ma.isMaskedArray(y.compute(scheduler="sync")) and y.compute(scheduler="sync").mask.sum() == 99
