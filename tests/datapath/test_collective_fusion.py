"""The collective's barriers and assemblies through dask's low-level fusion: each keeps its
own key in the optimized graph, whatever the graph is culled to, so that graphs computed in
a row on a spillway cluster never hand the scheduler one key for two tasks.

A boolean mask of a 2-d array ravels it, a reshape whose rechunk takes the collective on a
spillway cluster; a graph culled to one of its blocks leaves a barrier with one assembly,
which fusion would join with the reshape after it (dask's
``test_empty_chunk_nanmin_nanmax``, computed here on a spillway cluster as it is in
dask's test)."""

from __future__ import annotations

import time

import dask
import dask.array as da
import numpy as np
import pytest
from dask.base import collections_to_expr
from dask.core import get_dependencies

from spillway.datapath.collective.names import OUTPUT_PREFIX, is_barrier
from spillway.datapath.step.names import is_step


def _optimized(y, fuse: bool = True) -> dict:
    """The low-level graph of ``y`` as a computation sends it: culled, and fused where
    ``fuse``."""
    with dask.config.set({"optimization.fuse.active": fuse}):
        return dict(collections_to_expr([y], True).optimize().__dask_graph__())


def _barriers_and_assemblies(dsk) -> tuple[set, dict]:
    """The barriers (the steps) of ``dsk``, and each assembly (getter) that reads one -> one
    it reads."""
    barriers = {k for k in dsk if is_barrier(k) or is_step(k)}
    assemblies = {k: b for k in dsk for b in get_dependencies(dsk, k) & barriers}
    return barriers, assemblies


def _masked():
    x = np.arange(10).reshape(2, 5)
    d = da.from_array(x, chunks=2)
    return d[d > 4]


def _rechunked_then_added():
    x = da.from_array(np.arange(64.0).reshape(8, 8), chunks=(2, 8))
    return x.rechunk((8, 2)) + 1


@pytest.mark.parametrize("way", ["step", "pieces"])
@pytest.mark.parametrize("build", [_masked, _rechunked_then_added], ids=["mask-reshape", "rechunk-add"])
def test_barriers_and_assemblies_keep_their_keys_in_every_culled_graph(routed, build, way):
    """The pieces' barriers and assemblies, or the steps and their getters."""
    with dask.config.set({"spillway.exchange": way}):
        y = build()
    assert any(name.startswith("spillway-cut-" if way == "pieces" else "spillway-step-") for name in y.dask.layers)
    one_left = False
    for part in [y, *(y.blocks[i] for i in np.ndindex(y.numblocks))]:
        unfused, fused = _optimized(part, fuse=False), _optimized(part)
        barriers, assemblies = _barriers_and_assemblies(unfused)
        if way == "step" and not barriers:
            continue  # a part that needs none of the exchanged outputs (the mask's empty blocks)
        assert barriers and all(k[0].startswith(OUTPUT_PREFIX) for k in assemblies)
        kept = barriers | set(assemblies)
        assert kept <= set(fused), sorted(map(str, kept - set(fused)))
        assert all(fused[k].block_fusion for k in kept)
        one_left |= any(list(assemblies.values()).count(b) == 1 for b in barriers)
    assert one_left  # the case fusion took: a barrier with one assembly after it


@pytest.fixture(scope="module")
def spillway_client():
    import spillway

    with spillway.local(cpu=True, n_workers=2, dashboard_address=None) as cluster:
        yield cluster.client


def _pieces_left(dask_worker=None) -> int:
    return sum(1 for k in dask_worker.data if type(k) is tuple and str(k[0]).startswith("spillway-pieces-"))


def _no_pieces_left(client) -> bool:
    deadline = time.monotonic() + 10
    while sum(client.run(_pieces_left).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sum(client.run(_pieces_left).values()) == 0


@pytest.mark.parametrize("run", range(3))
def test_masked_blocks_and_nan_reductions_computed_in_a_row(spillway_client, run):
    """dask's test_empty_chunk_nanmin_nanmax and its _raise twin, one graph after another
    on a spillway cluster, against NumPy's float64 results."""
    client = spillway_client
    x = np.arange(10).reshape(2, 5)
    d = da.from_array(x, chunks=2)
    want = x[x > 4].astype(np.float64)
    masked = d[d > 4]
    assert any(name.startswith(("spillway-cut-", "spillway-step-")) for name in masked.dask.layers)

    blocks = [client.compute(b).result(timeout=60) for b in masked.blocks]
    assert 0 in [len(b) for b in blocks]
    np.testing.assert_array_equal(np.concatenate(blocks).astype(np.float64), want)
    assert _no_pieces_left(client)  # each barrier's end seen, its pieces dropped

    masked = masked.compute_chunk_sizes()
    assert 0 in masked.chunks[0]
    for func in ("nanmin", "nanmax"):
        got = client.compute(getattr(da, func)(masked)).result(timeout=60)
        np.testing.assert_array_equal(np.float64(got), getattr(np, func)(want))
    np.testing.assert_array_equal(client.compute(masked).result(timeout=60).astype(np.float64), want)

    nothing = d[d > 9].compute_chunk_sizes()
    for func in ("nanmin", "nanmax"):
        with pytest.raises(ValueError) as expected:
            getattr(np, func)(x[x > 9].astype(np.float64))
        with pytest.raises(ValueError) as got:
            client.compute(getattr(da, func)(nothing)).result(timeout=60)
        assert str(got.value) == str(expected.value)
    assert _no_pieces_left(client)
