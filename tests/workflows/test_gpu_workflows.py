"""Every workflow on two GPUs at several GB against its NumPy float64 reference, and a
~200 GB float64 input spread evenly over both GPUs. Runs on the 2-GPU host.

Prints a table (workflow, size, time, relative error, bytes per GPU) at the end of the
module, for the notes: ``python -m pytest -q tests/workflows/test_gpu_workflows.py``.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from spillway.launch import open_cluster
from spillway.options.settings import Options
from spillway.run.compute import run_workflow
from spillway.options.sizes import format_bytes

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

#: case -> (workflow, parameters); inputs of 3 to 8 GB
CASES = {
    "transpose-sum": ("transpose-sum", {"size": "24000x24000"}),
    "transpose-sum-f32": ("transpose-sum", {"size": "32000x32000", "dtype": "float32"}),
    "matmul": ("matmul", {"size": "20000x20000"}),
    "matmul-f32": ("matmul", {"size": "24000x24000", "dtype": "float32"}),
    "rechunk": ("rechunk", {"size": "24000x24000"}),
    "fft": ("fft", {"size": "32768x16384"}),
    "fft-f32": ("fft", {"size": "32768x16384", "dtype": "float32"}),
    "tsqr": ("tsqr", {"size": "8000000x64"}),
    "svd": ("svd", {"size": "8000000x64"}),
    "stencil-2d": ("stencil", {"ndim": 2, "size": "24000x24000", "depth": 2}),
    "stencil-3d": ("stencil", {"ndim": 3, "size": "1000x1000x1000", "depth": 1}),
    "sum": ("reduction", {"op": "sum", "size": "20000x20000"}),
    "mean-axis0": ("reduction", {"op": "mean", "axis": "0", "size": "20000x20000"}),
    "std": ("reduction", {"op": "std", "size": "20000x20000"}),
    "histogram": ("reduction", {"op": "histogram", "size": "20000x20000"}),
    "slice": ("slice", {"size": "24000x24000", "step": 3}),
    "gather": ("gather", {"size": "24000x24000", "count": 24000}),
    "elementwise": ("elementwise", {"size": "24000x24000"}),
    "elementwise-f32": ("elementwise", {"size": "32000x32000", "dtype": "float32"}),
}

ROWS: list[tuple] = []


@pytest.fixture(scope="module")
def gpu2(request):
    from spillway.options.gpus import discover

    if len(discover()) < 2:
        pytest.skip("needs two GPUs")
    with open_cluster(Options.resolve(devices="0,1", dashboard_address="")) as session:
        assert session.kind == "gpu" and session.n_workers == 2
        yield session
    # the table goes to the terminal even when pytest captures output
    with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        _print_table()


def _gb(n):
    return f"{n / 1e9:.1f}"


def _print_table():
    if not ROWS:
        return
    lines = ["", "| workflow | case | size | time (s) | relative error | tolerance | peak bytes per GPU (GB) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in ROWS:
        lines.append("| " + " | ".join(map(str, row)) + " |")
    print("\n".join(lines), flush=True)


@pytest.mark.parametrize("case", list(CASES))
def test_workflow_on_two_gpus(gpu2, case, capsys):
    name, params = CASES[case]
    report = run_workflow(gpu2, name, params, verify=True)
    v = report["verify"]
    peaks = [p for p in report["peak_bytes_per_worker"].values() if p is not None]
    size = "x".join(map(str, report["params"]["size"])) if isinstance(report["params"]["size"], list) \
        else format_bytes(report["params"]["size"])
    ROWS.append((name, case, f"{size} {report['params']['dtype']} ({_gb(report['footprint']['input_bytes'])} GB in)",
                 f"{report['wall_s']:.2f}", f"{v['rel_error']:.2e}", f"{v['tolerance']:.0e}",
                 " / ".join(_gb(p) for p in peaks)))
    with capsys.disabled():
        print(f"\n{case}: {report['wall_s']:.2f} s, rel error {v['rel_error']:.2e}, "
              f"transferred {format_bytes(report['bytes_transferred'])}, spilled {format_bytes(report['bytes_spilled'])}, "
              f"peaks {[format_bytes(p) for p in peaks]}", flush=True)
    assert v["ok"], f"{case}: relative error {v['rel_error']:.3e} > {v['tolerance']:.0e} ({v['reference']})"
    assert report["cluster"]["kind"] == "gpu"
    assert report["footprint"]["input_bytes"] >= 2e9


def test_200gb_input_is_balanced_over_both_gpus(gpu2, capsys):
    """A ~200 GB float64 input is larger than one GPU: it is spread so each GPU holds
    within 10% of an even share, rather than one filling up and spilling."""
    from distributed import wait
    from placement_checks import bytes_per_worker, imbalance

    from spillway.workflows import placement, random
    from spillway.workflows.chunking import auto_chunks, shape_from_size
    from spillway.workflows.params import Target
    from spillway.run.target import target_of

    client = gpu2.client
    target = target_of(gpu2)
    shape = shape_from_size(200 * 10**9, 2, "float64")
    nbytes = shape[0] * shape[1] * 8
    workers = placement.spread_workers(target, nbytes)
    assert len(workers) == 2, (target, nbytes)
    x = random.uniform(shape, auto_chunks(shape, "float64", Target(kind="gpu")), seed=1, backend="cupy",
                       workers=workers)
    start = time.perf_counter()
    placed = client.persist(x, optimize_graph=False)
    wait(placed)
    held = bytes_per_worker(client, placed)
    total = float(placed.sum().compute())
    elapsed = time.perf_counter() - start
    n = shape[0] * shape[1]
    with capsys.disabled():
        print(f"\n200 GB input {shape[0]}x{shape[1]} float64 ({_gb(nbytes)} GB) in {elapsed:.1f} s; bytes per GPU: "
              + ", ".join(f"{a}: {_gb(b)} GB" for a, b in held.items())
              + f"; imbalance {imbalance(held):.3%}", flush=True)
    ROWS.append(("placement", "200GB", f"{shape[0]}x{shape[1]} float64 ({_gb(nbytes)} GB in)", f"{elapsed:.2f}",
                 f"{abs(total / n - 0.5) / 0.5:.2e} (mean vs 1/2)", "statistical",
                 " / ".join(_gb(b) for b in held.values())))
    assert sum(held.values()) == nbytes
    assert imbalance(held) <= 0.10, held
    # the mean of 2.5e10 uniform values is 1/2 within a few standard errors
    assert abs(total / n - 0.5) < 6 * math.sqrt(1 / 12 / n)
    del placed


def test_zarr_store_written_and_read_by_gpu_workers(gpu2, tmp_path):
    """A rechunked array goes to a Zarr v3 store from both GPUs, and comes back into
    device memory as the input of the next run."""
    import zarr

    from reference_inputs import uniform_numpy

    out = tmp_path / "panels.zarr"
    report = run_workflow(gpu2, "rechunk", {"size": "16000x16000"}, verify=True, output=str(out))
    assert report["verify"]["ok"]
    stored = zarr.open_array(str(out), mode="r")
    # the chunk files' bytes: zarr pads a partial chunk at the array's edge to a whole one
    assert report["bytes_written"] == stored.nchunks * math.prod(stored.chunks) * 8 >= 16000 * 16000 * 8
    assert stored.metadata.zarr_format == 3
    np.testing.assert_array_equal(stored[:100, :100], uniform_numpy((16000, 16000), seed=0)[:100, :100])
    again = run_workflow(gpu2, "reduction", {"op": "std", "input": str(out)}, verify=True)
    assert again["verify"]["ok"]
    assert again["bytes_read"] == 16000 * 16000 * 8


class CudaArrayInterfaceOnly:
    """A device array that offers only ``__cuda_array_interface__``, as Numba's do."""

    def __init__(self, array):
        self._array = array
        self.shape = array.shape
        self.dtype = array.dtype
        self.__cuda_array_interface__ = array.__cuda_array_interface__


class DLPackOnly:
    def __init__(self, array):
        self._array = array
        self.shape = array.shape
        self.dtype = array.dtype

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_device_arrays_from_python_are_wrapped_without_a_copy(gpu2):
    import cupy

    from spillway.workflows import inputs

    a = cupy.random.default_rng(0).random((4000, 3000))
    for given in (a, CudaArrayInterfaceOnly(a), DLPackOnly(a)):
        wrapped = inputs.wrap(given, "cupy")
        assert isinstance(wrapped, cupy.ndarray)
        assert wrapped.data.ptr == a.data.ptr
    host = a.get()
    for given in (a, CudaArrayInterfaceOnly(a), DLPackOnly(a)):
        report = run_workflow(gpu2, "reduction", {"op": "sum", "chunks": "1000x1000"}, verify=True,
                              arrays={"x": given})
        assert report["verify"]["ok"]
        assert report["result"]["sum"] == pytest.approx(float(host.sum()), rel=1e-12)


def test_200gb_workflow_run_spreads_its_input(gpu2, capsys):
    """The same through the runner: a 200 GB sum, its input placed evenly on both GPUs."""
    from placement_checks import imbalance

    report = run_workflow(gpu2, "reduction", {"op": "sum", "size": "200GB"})
    planned = report["result"]["input_bytes_per_worker"]
    n = report["result"]["input_shape"][0] * report["result"]["input_shape"][1]
    peaks = [p for p in report["peak_bytes_per_worker"].values() if p is not None]
    with capsys.disabled():
        print(f"\n200 GB sum through the runner: {report['wall_s']:.1f} s; input per GPU "
              + ", ".join(f"{_gb(b)} GB" for b in planned.values())
              + f"; peak per GPU {[_gb(p) for p in peaks]} GB; spilled {format_bytes(report['bytes_spilled'])}",
              flush=True)
    ROWS.append(("reduction", "sum-200GB", f"{report['result']['shape'][0]}x{report['result']['shape'][1]} float64 "
                 f"({_gb(report['footprint']['input_bytes'])} GB in)", f"{report['wall_s']:.2f}",
                 f"{abs(report['result']['sum'] / n - 0.5) / 0.5:.2e} (mean vs 1/2)", "statistical",
                 " / ".join(_gb(p) for p in peaks)))
    assert len(planned) == 2
    assert imbalance(planned) <= 0.10
    assert abs(report["result"]["sum"] / n - 0.5) < 6 * math.sqrt(1 / 12 / n)
