"""Answers through the exchange made as one step a worker (spillway.datapath.step) are
dask's own, bit for bit: users' rechunks of odd grids and dtypes, transposes, FFT
pipelines, map_overlap with each boundary, persisted inputs and inputs made in the same
graph, on real worker processes of a cluster whose scheduler coordinates steps. Each
answer is checked against dask's own method computed on the same cluster
(``array.rechunk.method: tasks``, :func:`~spillway.datapath.collective.method.dask_halos`),
and each case checks that the step was the path taken."""

from __future__ import annotations

import contextlib

import dask
import dask.array as da
import numpy as np
import pytest
from dask.array.overlap import overlap as dask_overlap

from spillway.datapath.collective.method import dask_halos

STEP = "spillway-step-"
OUTPUT = "rechunk-exchange-"


@contextlib.contextmanager
def _step_cluster(**kwargs):
    """A client of local worker processes over TCP whose scheduler coordinates steps and
    runs the collective, routed as a spillway cluster's client is, rechunks through P2P."""
    from distributed import Client, LocalCluster

    from spillway.datapath.collective import CollectivePlacement, use_on
    from spillway.datapath.collective.method import stop_using
    from spillway.datapath.step.coordinator import StepCoordinator

    options = {"n_workers": 3, "threads_per_worker": 1, **kwargs}
    with LocalCluster(processes=True, host="127.0.0.1", protocol="tcp", dashboard_address=None,
                      **options) as cluster, Client(cluster) as c:
        c.register_plugin(StepCoordinator())
        c.register_plugin(CollectivePlacement())
        use_on(c)
        try:
            with dask.config.set({"array.rechunk.method": "p2p"}):
                room = c.sync(lambda: c.scheduler.spillway_collective_room())
                assert room["steps"] and room["workers"] == options["n_workers"], room
                yield c
        finally:
            stop_using(c)


@pytest.fixture(scope="module")
def client():
    with _step_cluster() as c:
        yield c


def _stepped(y) -> bool:
    return any(name.startswith(STEP) for name in y.dask.layers)


def _dask_rechunk(x, chunks):
    with dask.config.set({"array.rechunk.method": "tasks"}):
        ref = x.rechunk(chunks)
    assert not _stepped(ref)
    return ref


def _data(shape, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    return got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)


# --- rechunks

RECHUNKS = [
    # (shape, dtype, input chunks, output chunks)
    pytest.param((37, 53), np.float64, (5, 53), (37, 7), id="rows-to-columns-odd"),
    pytest.param((37, 53), np.float64, ((3, 10, 24), (20, 33)), ((13, 24), (7, 7, 39)), id="irregular"),
    pytest.param((37, 53), np.int32, (5, 53), (37, 7), id="int32"),
    pytest.param((37, 53), np.complex128, (6, 9), (11, 4), id="complex128"),
    pytest.param((101, 67), np.float64, (9, 11), (13, 10), id="uneven-both-axes"),
    pytest.param((11, 13, 17), np.float64, (3, 13, 17), (11, 4, 5), id="3d-slabs-to-pencils"),
    pytest.param((11, 13, 17), np.int32, (4, 5, 6), (6, 4, 17), id="3d-int32-odd"),
    pytest.param((20, 22), np.float64, ((10, 10), (6, 6, 10)), ((10, 10), (4, 8, 10)), id="exchange-and-direct"),
    pytest.param((37, 53), np.float64, (5, 53), (37, 27), id="fewer-outputs-than-workers"),
    pytest.param((37, 53), np.float64, ((20, 17), (53,)), ((37,), (7,) * 7 + (4,)), id="fewer-inputs-than-workers"),
    pytest.param((64, 48), np.float32, (1, 48), (64, 1), id="one-element-wide-chunks"),
    pytest.param((103,), np.float64, (7,), (10,), id="1d"),
    pytest.param((6, 7, 8, 9), np.uint8, (2, 7, 8, 3), (6, 3, 5, 9), id="4d-uint8"),
]


@pytest.mark.parametrize("shape, dtype, chunks, new", RECHUNKS)
def test_a_rechunk_through_the_step_is_dask_s_bit_for_bit(client, shape, dtype, chunks, new):
    a = _data(shape, dtype)
    x = da.from_array(a, chunks=chunks)
    y = x.rechunk(new)
    ref = _dask_rechunk(x, new)
    assert _stepped(y) and any(name.startswith(OUTPUT) for name in y.dask.layers)
    assert y.chunks == ref.chunks
    got, want = dask.compute(y, ref)
    assert _same(got, want) and _same(got, a)
    # each block is its own chunk as dask's method makes it
    blocks = y.blocks
    for index in [(0,) * y.ndim, tuple(n - 1 for n in y.numblocks)]:
        assert _same(blocks[index].compute(), ref.blocks[index].compute())


def test_a_rechunk_computed_again_and_a_chain_of_exchanges(client):
    a = _data((45, 38), seed=3)
    x = da.from_array(a, chunks=(4, 38))
    y = x.rechunk((45, 5))
    z = y.rechunk((7, 9)).rechunk((45, 4))  # three exchanges in a row
    assert _stepped(y) and sum(name.startswith(STEP) for name in z.dask.layers) == 3
    for _ in range(2):
        assert _same(y.compute(), a)
    # an exchange and the chain built on it, in one graph
    got_y, got_z, want = dask.compute(y, z, _dask_rechunk(_dask_rechunk(x, (7, 9)), (45, 4)))
    assert _same(got_y, a) and _same(got_z, want) and _same(got_z, a)


def test_an_exchange_in_several_rounds(client):
    # a few hundred bytes a round: each slot joins its outputs in several rounds
    a = _data((40, 36), seed=19)
    x = da.from_array(a, chunks=(4, 36))
    with dask.config.set({"spillway.exchange-round-bytes": 800}):
        y = x.rechunk((40, 3))
    step = next(task for name, layer in y.dask.layers.items() if name.startswith(STEP) for task in layer.values())
    args = tuple(step.args) if hasattr(step, "args") else tuple(step[1:])
    _, _, spec = args[:3]  # (name, slot, (old, new, slots, rounds, dtype, module), *blocks)
    assert spec[2] == 3 and spec[3] > 1, spec[2:4]
    got, want = dask.compute(y, _dask_rechunk(x, (40, 3)))
    assert _stepped(y) and _same(got, want) and _same(got, a)


# --- transposes


def test_a_transpose_rechunked(client):
    a = _data((37, 53), seed=1)
    x = da.from_array(a, chunks=(5, 53))
    y = x.T.rechunk((7, 37))
    ref = _dask_rechunk(x.T, (7, 37))
    assert _stepped(y)
    got, want = dask.compute(y, ref)
    assert _same(got, want) and _same(got, a.T)


def test_x_plus_its_transpose(client):
    a = _data((48, 48), seed=2)
    x = da.from_array(a, chunks=(5, 48))
    # the transpose brought to x's chunks: an exchange (each column chunk feeds every row chunk)
    y = x + x.T.rechunk(x.chunks)
    ref = x + _dask_rechunk(x.T, x.chunks)
    # dask's own unification (splits only), then an exchange of its 5 x 5 tiles
    s = (x + x.T).rechunk((48, 7))
    with dask.config.set({"array.rechunk.method": "tasks"}):
        s_ref = (x + x.T).rechunk((48, 7))
    assert _stepped(y) and _stepped(s) and not _stepped(s_ref)
    got, want, got_s, want_s = dask.compute(y, ref, s, s_ref)
    assert _same(got, want) and _same(got_s, want_s)
    assert _same(got, a + a.T) and _same(got_s, a + a.T)


# --- FFT


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    return float(np.abs(got - want).max() / np.abs(want).max()) <= 1e-12


def test_fft_along_rows_after_a_rechunk(client):
    a = _data((96, 80), seed=4)
    x = da.from_array(a, chunks=(8, 80))  # row chunks
    c = x.rechunk({0: -1, 1: 10})         # whole columns: an exchange
    assert _stepped(c)
    f = da.fft.fft(c, axis=0)
    f_ref = da.fft.fft(_dask_rechunk(x, {0: -1, 1: 10}), axis=0)
    # rechunk({0: -1}) alone only merges (each input chunk goes to one output): dask's own
    g = da.from_array(a, chunks=(8, 20)).rechunk({0: -1})
    assert not _stepped(g) and g.chunks == ((96,), (20,) * 4)
    gf = da.fft.fft(g, axis=0)
    gf_ref = da.fft.fft(_dask_rechunk(da.from_array(a, chunks=(8, 20)), {0: -1}), axis=0)
    got, want, got_g, want_g = dask.compute(f, f_ref, gf, gf_ref)
    reference = np.fft.fft(a, axis=0)
    assert _close(got, reference) and _same(got, want)
    assert _close(got_g, reference) and _same(got_g, want_g)


def test_fft2_of_a_rechunked_volume(client):
    a = _data((24, 20, 30), seed=5)
    x = da.from_array(a, chunks=(4, 20, 30))  # slabs along axis 0
    c = x.rechunk({0: -1, 1: -1, 2: 7})
    assert _stepped(c)
    f = da.fft.fft2(c, axes=(0, 1))
    with dask.config.set({"array.rechunk.method": "tasks"}):
        f_ref = da.fft.fft2(x.rechunk({0: -1, 1: -1, 2: 7}), axes=(0, 1))
    assert not _stepped(f_ref)
    got, want = dask.compute(f, f_ref)
    assert _close(got, np.fft.fft2(a, axes=(0, 1))) and _same(got, want)


def test_an_fft_rechunk_fft_pipeline(client):
    a = _data((90, 72), seed=6)
    x = da.from_array(a, chunks=(9, 72))

    def pipeline(v):
        v = da.fft.fft(v.rechunk({0: -1, 1: 8}), axis=0)  # rows -> columns
        return da.fft.fft(v.rechunk({0: 10, 1: -1}), axis=1)  # columns -> rows

    y = pipeline(x)
    assert sum(name.startswith(STEP) for name in y.dask.layers) == 2
    with dask.config.set({"array.rechunk.method": "tasks"}):
        ref = pipeline(x)
    assert not _stepped(ref)
    got, want = dask.compute(y, ref)
    assert _close(got, np.fft.fft2(a)) and _same(got, want)
    # and back: the inverse through two more exchanges
    back = da.fft.ifft(da.fft.ifft(y, axis=1).rechunk({0: -1, 1: 8}), axis=0).real
    assert _close(back.compute(), a)


# --- map_overlap


def _stencil(b):
    # every element reads neighbours up to the halos' depths, so a wrong halo shows
    return b + 0.5 * np.roll(b, 2, axis=0) - 0.25 * np.roll(b, -3, axis=1) + np.roll(b, (-1, 1), axis=(0, 1))


OVERLAP_GRID = ((72, 84), (6, 7))  # 12 x 12 chunks: halos along two axes take the exchange


@pytest.mark.parametrize("boundary", ["reflect", "periodic", "nearest", "none", 0])
def test_map_overlap_with_each_boundary(client, boundary):
    shape, chunks = OVERLAP_GRID
    a = _data(shape, seed=7)
    x = da.from_array(a, chunks=chunks)
    depth = {0: 2, 1: 3}
    grown = dask_overlap(x, depth, boundary)
    assert _stepped(grown)
    y = x.map_overlap(_stencil, depth=depth, boundary=boundary, dtype=a.dtype)
    assert _stepped(y)
    with dask_halos():
        grown_ref = dask_overlap(x, depth, boundary)
        ref = x.map_overlap(_stencil, depth=depth, boundary=boundary, dtype=a.dtype)
    assert not _stepped(ref) and not _stepped(grown_ref)
    assert grown.chunks == grown_ref.chunks
    got, want, got_grown, want_grown = dask.compute(y, ref, grown, grown_ref)
    assert _same(got, want) and _same(got_grown, want_grown)


@pytest.mark.parametrize("depth", [{0: (1, 2), 1: (3, 1)}, {0: (2, 1), 1: (1, 3)}])
def test_map_overlap_with_asymmetric_depths(client, depth):
    # dask takes (left, right) depths for boundary "none" only
    shape, chunks = OVERLAP_GRID
    a = _data(shape, seed=8)
    x = da.from_array(a, chunks=chunks)
    y = x.map_overlap(_stencil, depth=depth, boundary="none", dtype=a.dtype)
    assert _stepped(y)
    with dask_halos():
        ref = x.map_overlap(_stencil, depth=depth, boundary="none", dtype=a.dtype)
    assert not _stepped(ref)
    got, want = dask.compute(y, ref)
    assert _same(got, want)


def test_map_overlap_in_three_dimensions_with_ints(client):
    a = _data((18, 15, 12), np.int32, seed=9)
    x = da.from_array(a, chunks=(6, 5, 4))  # 3 x 3 x 3 chunks, 5 x 5 x 5 with the periodic pads
    depth = {0: 1, 1: 2, 2: 1}

    def f(b):
        return b - np.roll(b, 1, axis=0) + np.roll(b, -2, axis=1) - np.roll(b, 1, axis=2)

    y = x.map_overlap(f, depth=depth, boundary="periodic", dtype=a.dtype)
    assert _stepped(y)
    with dask_halos():
        ref = x.map_overlap(f, depth=depth, boundary="periodic", dtype=a.dtype)
    got, want = dask.compute(y, ref)
    assert _same(got, want)


# --- persisted inputs, and inputs made in the same graph


def test_persisted_inputs(client):
    a = _data((60, 77), seed=10)
    x = da.from_array(a, chunks=(6, 77)).persist()
    y = x.rechunk((60, 9))
    assert _stepped(y)
    got, want = dask.compute(y, _dask_rechunk(x, (60, 9)))
    assert _same(got, want) and _same(got, a)
    # a map_overlap of a persisted grid
    p = da.from_array(_data((72, 84), seed=11), chunks=(6, 7)).persist()
    z = p.map_overlap(_stencil, depth={0: 2, 1: 3}, boundary="none", dtype=p.dtype)
    assert _stepped(z)
    with dask_halos():
        z_ref = p.map_overlap(_stencil, depth={0: 2, 1: 3}, boundary="none", dtype=p.dtype)
    got, want = dask.compute(z, z_ref)
    assert _same(got, want)


def test_inputs_made_in_the_same_graph(client):
    a = _data((60, 77), seed=12)
    x = da.from_array(a, chunks=(6, 77)) * 3.0 + 1.0
    y = x.rechunk((60, 9))
    assert _stepped(y)
    got, want = dask.compute(y, _dask_rechunk(x, (60, 9)))
    assert _same(got, want) and _same(got, a * 3.0 + 1.0)
    # random numbers made on the workers, and a persisted array beside them
    r = da.random.default_rng(13).standard_normal((50, 64), chunks=(5, 64))
    held = da.from_array(_data((50, 64), seed=14), chunks=(5, 64)).persist()
    s = (r + held).rechunk((50, 6))
    assert _stepped(s)
    got, want, r_all, held_all = dask.compute(s, _dask_rechunk(r + held, (50, 6)), r, held)
    assert _same(got, want) and _same(got, r_all + held_all)
    # the step's outputs reduced in the same graph
    total, total_ref = dask.compute(s.sum(axis=0), _dask_rechunk(r + held, (50, 6)).sum(axis=0))
    assert _same(total, total_ref)


# --- other clusters


def test_two_workers_of_two_threads():
    with _step_cluster(n_workers=2, threads_per_worker=2):
        a = _data((37, 53), seed=15)
        x = da.from_array(a, chunks=(5, 53))
        y = x.rechunk((37, 7))
        assert _stepped(y)
        got, want = dask.compute(y, _dask_rechunk(x, (37, 7)))
        assert _same(got, want) and _same(got, a)
        b = _data((72, 84), seed=16)
        g = da.from_array(b, chunks=(6, 7))
        z = g.map_overlap(_stencil, depth={0: 2, 1: 3}, boundary="periodic", dtype=b.dtype)
        assert _stepped(z)
        with dask_halos():
            z_ref = g.map_overlap(_stencil, depth={0: 2, 1: 3}, boundary="periodic", dtype=b.dtype)
        f = da.fft.fft(g.rechunk({0: -1, 1: 10}), axis=0)
        f_ref = da.fft.fft(_dask_rechunk(g, {0: -1, 1: 10}), axis=0)
        got, want, got_f, want_f = dask.compute(z, z_ref, f, f_ref)
        assert _same(got, want)
        assert _close(got_f, np.fft.fft(b, axis=0)) and _same(got_f, want_f)


def test_a_single_worker():
    with _step_cluster(n_workers=1, threads_per_worker=1):
        a = _data((37, 53), np.complex128, seed=17)
        x = da.from_array(a, chunks=((3, 10, 24), (20, 33)))
        y = x.rechunk(((13, 24), (7, 7, 39)))
        assert _stepped(y)
        got, want = dask.compute(y, _dask_rechunk(x, ((13, 24), (7, 7, 39))))
        assert _same(got, want) and _same(got, a)
        b = _data((72, 84), seed=18)
        g = da.from_array(b, chunks=(6, 7)).persist()
        z = g.map_overlap(_stencil, depth={0: 2, 1: 3}, boundary="none", dtype=b.dtype)
        assert _stepped(z)
        with dask_halos():
            z_ref = g.map_overlap(_stencil, depth={0: 2, 1: 3}, boundary="none", dtype=b.dtype)
        got, want = dask.compute(z, z_ref)
        assert _same(got, want)
