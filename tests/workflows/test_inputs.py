"""Inputs: seeded generation independent of chunks and workers, Zarr v3 stores, and
arrays handed over from Python."""

from __future__ import annotations

import numpy as np
import pytest

from reference_inputs import uniform_numpy
from spillway import workflows
from spillway.options.errors import ParamError
from spillway.run.compute import run_workflow
from spillway.workflows import inputs, random
from spillway.workflows.params import Target


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_generation_does_not_depend_on_chunks(dtype):
    shape = (123, 77)
    whole = uniform_numpy(shape, seed=7, dtype=dtype)
    for chunks in [(123, 77), (10, 10), (50, 7), (1, 77)]:
        got = random.uniform(shape, chunks, seed=7, dtype=dtype).compute(scheduler="sync")
        np.testing.assert_array_equal(got, whole)
    assert got.dtype == np.dtype(dtype)
    assert 0.0 <= whole.min() and whole.max() < 1.0


def test_generation_depends_on_seed_and_stream():
    a = uniform_numpy((50, 50), seed=1)
    assert not np.array_equal(a, uniform_numpy((50, 50), seed=2))
    assert not np.array_equal(a, uniform_numpy((50, 50), seed=1, stream=1))
    # uniform: mean 1/2, variance 1/12 within a few standard errors
    big = uniform_numpy((1000, 1000), seed=3)
    assert abs(big.mean() - 0.5) < 5 * np.sqrt(1 / 12 / big.size)
    assert abs(big.var() - 1 / 12) < 1e-3


def test_generation_on_workers_matches_the_client(cpu_session):
    shape = (300, 200)
    x = random.uniform(shape, (70, 45), seed=11)
    on_cluster = cpu_session.client.compute(x).result()
    np.testing.assert_array_equal(on_cluster, uniform_numpy(shape, seed=11))


def _write_zarr(path, array, chunks):
    import zarr

    z = zarr.create_array(store=str(path), shape=array.shape, chunks=chunks, dtype=array.dtype, zarr_format=3)
    z[...] = array
    return z


def test_zarr_input_is_read_and_checked(cpu_session, tmp_path):
    data = uniform_numpy((300, 300), seed=5)
    _write_zarr(tmp_path / "x.zarr", data, (64, 64))
    report = run_workflow(cpu_session, "transpose-sum", {"input": str(tmp_path / "x.zarr"), "chunks": "100x100"},
                          verify=True)
    assert report["verify"]["ok"]
    assert report["result"]["sum"] == pytest.approx(float((data + data.T).sum()), rel=1e-12)
    assert report["bytes_read"] == data.nbytes


def test_zarr_round_trip(cpu_session, tmp_path):
    """A result written to a Zarr store by the workers reads back equal to the reference,
    and is a valid input of the next run."""
    import zarr

    out = tmp_path / "rechunked.zarr"
    report = run_workflow(cpu_session, "rechunk", {"size": "400x300", "chunks": "50x300"}, verify=True,
                          output=str(out))
    assert report["verify"]["ok"]
    assert report["bytes_written"] == 400 * 300 * 8
    stored = zarr.open_array(str(out), mode="r")
    assert stored.metadata.zarr_format == 3
    assert stored.chunks == (400, 50)  # column panels, as the workers wrote them
    assert stored.compressors == () and stored.filters == ()  # uncompressed: what GPU workers read fastest
    np.testing.assert_array_equal(stored[...], uniform_numpy((400, 300), seed=0))

    again = run_workflow(cpu_session, "reduction", {"op": "sum", "input": str(out)}, verify=True)
    assert again["verify"]["ok"]
    assert again["bytes_read"] == 400 * 300 * 8


def test_zarr_round_trip_of_a_computed_result(cpu_session, tmp_path):
    import zarr

    out = tmp_path / "product.zarr"
    run_workflow(cpu_session, "matmul", {"size": "120x80", "chunks": "40x40"}, output=str(out))
    x = uniform_numpy((120, 80), seed=0)
    y = uniform_numpy((80, 120), seed=0, stream=1)
    got = zarr.open_array(str(out), mode="r")[...]
    assert np.linalg.norm(got - x @ y) / np.linalg.norm(x @ y) < 1e-12


def test_output_needs_an_array_result(cpu_session, tmp_path):
    with pytest.raises(ParamError, match="output: transpose-sum has no array result"):
        run_workflow(cpu_session, "transpose-sum", {}, output=str(tmp_path / "s.zarr"))


def test_numpy_and_dask_arrays_from_python(cpu_session):
    import dask.array as da

    a = np.arange(200 * 200, dtype=np.float64).reshape(200, 200) / 1000.0
    for given in (a, da.from_array(a, chunks=50)):
        report = run_workflow(cpu_session, "transpose-sum", {"chunks": "100x100"}, verify=True, arrays={"x": given})
        assert report["verify"]["ok"]
        assert report["result"]["sum"] == pytest.approx(float((a + a.T).sum()), rel=1e-12)


class DLPackOnly:
    """An array that offers only DLPack, as PyTorch CPU tensors do."""

    def __init__(self, array):
        self._array = array
        self.shape = array.shape
        self.dtype = array.dtype

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_host_arrays_are_wrapped_without_a_copy():
    a = uniform_numpy((64, 32), seed=2)
    for given in (a, DLPackOnly(a), memoryview(a)):
        wrapped = inputs.wrap(given, "numpy")
        assert isinstance(wrapped, np.ndarray)
        assert np.shares_memory(wrapped, a)


def test_dlpack_array_runs(cpu_session):
    a = uniform_numpy((120, 90), seed=4)
    report = run_workflow(cpu_session, "matmul", {"chunks": "60x30"}, verify=True,
                          arrays={"x": DLPackOnly(a), "y": a.T.copy()})
    assert report["verify"]["ok"]


def test_array_inputs_are_checked():
    wf = workflows.get("matmul")
    with pytest.raises(ParamError, match="z: not an array input of matmul"):
        wf.validate({}, Target(), arrays={"z": np.zeros((2, 2))})
    with pytest.raises(ParamError, match="y: shape 3x4 does not match x 4x5"):
        wf.validate({}, Target(), arrays={"x": np.zeros((4, 5)), "y": np.zeros((3, 4))})
    with pytest.raises(ParamError, match="dtype int64 is not supported"):
        workflows.get("reduction").validate({}, Target(), arrays={"x": np.zeros((4, 5), dtype=np.int64)})
    with pytest.raises(ParamError, match="is not an array"):
        workflows.get("reduction").validate({}, Target(), arrays={"x": [[1.0]]})


def test_panels_cover_the_input_in_order():
    params = workflows.get("reduction").validate({"size": "301x97", "seed": 3}, Target())
    source = inputs.open_source(params, Target(), (50, 50))
    whole = source.whole()
    for budget in (8 * 97, 8 * 97 * 7, 10**9):
        parts = list(source.panels(budget))
        assert [p[0] for p in parts] == sorted(p[0] for p in parts)
        assert parts[-1][1] == 301
        np.testing.assert_array_equal(np.concatenate([p[2] for p in parts]), whole)


def test_panels_apply_then_in_the_reading_threads_and_keep_the_order():
    import threading

    params = workflows.get("reduction").validate({"size": "301x97", "seed": 3}, Target())
    source = inputs.open_source(params, Target(), (50, 50))
    whole = source.whole()
    threads = set()

    def row_sums(block):
        threads.add(threading.get_ident())
        return block.sum(axis=1)

    parts = list(source.panels(8 * 97 * 7, then=row_sums))
    np.testing.assert_allclose(np.concatenate([p[2] for p in parts]), whole.sum(axis=1), rtol=1e-14)
    assert threading.get_ident() not in threads
