"""The graphs of users' rechunks and map_overlaps while spillway's route is in place
(spillway.datapath.collective.method): every layer declares exactly the layers its tasks
read, so that dask's ``assert_eq`` graph check (``HighLevelGraph.validate``) passes, for
every shape dask takes: empty and 0-d arrays, empty and uneven chunks, partials that only
split or merge beside ones that exchange, each boundary kind and a depth per axis.
Arrays with nothing to exchange, or no known grid, are dask's own; small overlaps too, so
that a halo along one axis makes no more tasks than one along both, as dask's tests of
small overlaps check. Built on dask's local scheduler: the route is taken as on a spillway
cluster (``_on_spillway``), with no cluster to ask for room."""

from __future__ import annotations

import math

import dask
import dask.array as da
import numpy as np
import pytest
from dask.array.utils import assert_eq

from spillway.datapath.collective import graph


def _exchanged(y) -> bool:
    return any(name.startswith(("spillway-cut-", "spillway-step-")) for name in y.dask.layers)


def _declared_are_read(y):
    """Each layer's declared dependencies against those its tasks' keys give (what
    ``HighLevelGraph.validate`` raises on), for a message that names the layer."""
    from dask.highlevelgraph import compute_layer_dependencies

    hlg = y.__dask_graph__()
    read = compute_layer_dependencies(hlg.layers)
    assert {k: set(v) for k, v in hlg.dependencies.items()} == {k: set(v) for k, v in read.items()}


RECHUNKS = [
    # (shape, input chunks, output chunks, whether the collective takes it)
    ((37, 53), (5, 53), (37, 4), True),                       # row panels to column panels
    ((37, 53), (6, 9), ((10, 27), (20, 33)), True),           # uneven chunks out
    ((30, 20), ((10, 10, 10), (20,)), ((5, 15, 10), (4,) * 5), True),  # an exchange beside a split
    ((30, 8), ((10, 10, 10), (8,)), ((5, 15, 10), (2,) * 4), True),   # an exchange, then a partial alone
    ((8, 9, 10), (3, 9, 2), (8, 2, 5), True),                  # three axes
    ((12, 7), ((4, 0, 8), (7,)), (12, 2), True),              # an empty chunk in
    ((7, 24), ((7,), (10, 0, 0, 9, 0, 5)), (2, 3), True),     # dask's test_rechunk_empty_chunks
    ((0, 10), (5, 5), (2, 2), False),                         # no elements (dask's test_rechunk_empty)
    ((4, 0, 6, 10), 3, {0: 4, 2: 2}, False),                  # no elements along one axis
]


@pytest.mark.parametrize("shape, chunks, new, exchanged", RECHUNKS)
def test_a_routed_rechunk_passes_dask_s_graph_check(routed, shape, chunks, new, exchanged):
    data = np.arange(math.prod(shape), dtype=float).reshape(shape)
    x = da.from_array(data, chunks=chunks)
    y = x.rechunk(new)
    assert _exchanged(y) == exchanged
    _declared_are_read(y)
    assert_eq(y, data)  # the graph check, the chunks and the values
    assert y.chunks == x.rechunk(new, method="tasks").chunks


@pytest.mark.parametrize("way, between", [("step", "spillway-step-"), ("pieces", "spillway-barrier-")])
def test_a_partial_that_only_merges_reads_the_input_and_is_declared_to(routed, way, between):
    """One partial exchanges (steps or a barrier in between), the other is an output made
    from its input directly: the outputs' layer reads both, and says so."""
    import dask

    with dask.config.set({"spillway.exchange": way}):
        x = da.from_array(np.arange(600.0).reshape(30, 20), chunks=((10, 10, 10), (20,)))
        y = x.rechunk(((5, 15, 10), (4,) * 5))
        out = y.dask.dependencies[y.name]
        assert x.name in out and any(name.startswith(between) for name in out)
        z = x.rechunk(((15, 15), (4,) * 5))  # one partial, exchanging: the input is the steps' or cuts' alone
        assert x.name not in z.dask.dependencies[z.name]
        assert_eq(z, x.compute())
        assert_eq(y, x.compute())


def test_arrays_with_nothing_to_exchange_or_no_grid_are_dask_s_own():
    empty = da.ones((0, 10), chunks=(5, 5))
    assert not _exchanged(graph.rechunk(empty, (2, 2), room=None))
    assert_eq(graph.rechunk(empty, (2, 2), room=None), np.ones((0, 10)))
    scalar = da.from_array(np.float64(3.0))
    assert graph.rechunk(scalar, (), room=None) is scalar
    unknown = da.from_array(np.arange(40.0).reshape(4, 10), chunks=(2, 5))
    unknown = unknown[unknown[:, 0] >= 0]  # chunks of unknown size along axis 0
    assert math.isnan(unknown.chunks[0][0])
    with pytest.raises(ValueError):  # dask refuses a rechunk of unknown chunk sizes, as its own
        graph.rechunk(unknown, (4, 2), room=None)
    from dask.array.overlap import overlap_internal as dask_s

    grown = graph.overlap_internal(unknown, {0: 0, 1: 1}, room=None, fallback=dask_s)
    assert grown.name == dask_s(unknown, {0: 0, 1: 1}).name
    grown = graph.overlap_internal(empty, {0: 1, 1: 1}, room=None, fallback=dask_s)
    assert grown.name == dask_s(empty, {0: 1, 1: 1}).name


BOUNDARIES = ["none", "reflect", "periodic", "nearest", 0.5]


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("depth", [1, {0: 2, 1: 0, 2: 1}, {0: 0, 1: 3, 2: 0}])
def test_a_routed_map_overlap_passes_dask_s_graph_check(routed, boundary, depth):
    data = np.random.default_rng(0).random((48, 40, 36))
    x = da.from_array(data, chunks=(12, 10, 12))
    with dask.config.set({"array.rechunk.threshold": 1}):  # halos along one axis too
        y = x.map_overlap(lambda b: b * 2, depth=depth, boundary=boundary)
    assert _exchanged(y)
    _declared_are_read(y)
    with dask.config.set({"array.rechunk.method": None}):
        want = x.map_overlap(lambda b: b * 2, depth=depth, boundary=boundary)
    assert_eq(y, want)


def test_one_sided_depths_pass_dask_s_graph_check(routed):
    data = np.random.default_rng(1).random((60, 60))
    x = da.from_array(data, chunks=(6, 10))
    with dask.config.set({"array.rechunk.threshold": 1}):
        y = x.map_overlap(lambda b: b + 1, depth={0: (2, 1), 1: (0, 3)}, boundary="none")
    assert _exchanged(y)
    assert_eq(y, data + 1)


def test_a_routed_map_overlap_of_an_empty_array_is_dask_s_own(routed):
    x = da.ones((0, 40), chunks=(5, 10))  # dask takes a depth only along the axis with elements
    with dask.config.set({"array.rechunk.threshold": 1}):
        y = x.map_overlap(lambda b: b, depth={0: 0, 1: 1}, boundary="none")
    assert not _exchanged(y)
    assert_eq(y, np.ones((0, 40)))


def test_a_small_halo_along_one_axis_makes_fewer_tasks_than_along_both(routed):
    """dask's test_overlap_few_dimensions: on a 10 x 10 grid the collective would make a
    barrier a column for a halo along axis 0 (210 tasks) and one barrier for both axes
    (201): more tasks for less halo. Such small overlaps are dask's own."""
    x = da.ones((100, 100), chunks=(10, 10))
    a = x.map_overlap(lambda b: b, depth={0: 1}, boundary="none")
    b = x.map_overlap(lambda b: b, depth={1: 1}, boundary="none")
    c = x.map_overlap(lambda b: b, depth={0: 1, 1: 1}, boundary="none")
    assert len(a.dask) == len(b.dask) < len(c.dask) < 10 * len(a.dask)
    assert not any(map(_exchanged, (a, b, c)))


def test_halos_of_a_large_grid_still_take_the_exchange(routed):
    x = da.ones((160, 160), chunks=(10, 10))  # 256 chunks: 2,116 pieces, past 4 x 512
    c = x.map_overlap(lambda b: b, depth={0: 1, 1: 1}, boundary="none")
    assert _exchanged(c)
    with dask.config.set({"array.rechunk.threshold": 8}):  # dask's own knob moves the line
        assert not _exchanged(x.map_overlap(lambda b: b, depth={0: 1, 1: 1}, boundary="none"))
