"""The example notebooks, executed cell by cell with nbclient in a real Jupyter kernel:
the local-mode notebook on its own embedded cluster, the shared-service notebook against
a real `spillway serve` on loopback. CPU here; the GPU tests run both on the GPU host."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

# the service tests' helpers start `spillway serve` on loopback and add tenants
sys.path.insert(0, str(Path(__file__).parents[1] / "service" / "api"))
from serve_helpers import Server, add_tenant  # noqa: E402

EXAMPLES = Path(__file__).parents[2] / "examples"

pytestmark = pytest.mark.slow


def execute(name: str, tmp_path: Path, *, cell_timeout: int) -> nbformat.NotebookNode:
    """Run notebook ``name`` in a fresh kernel (this interpreter's); a failing cell fails
    the test with its traceback. The executed copy is kept next to the test's files."""
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    finally:
        nbformat.write(nb, tmp_path / name)
    return nb


def outputs(nb, mime: str) -> list:
    return [o["data"][mime] for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.get("output_type") in ("execute_result", "display_data") and mime in o.get("data", {})]


def summary(nb) -> dict:
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream" and "SUMMARY " in o.get("text", ""):
                line = next(x for x in o["text"].splitlines() if x.startswith("SUMMARY "))
                return json.loads(line.removeprefix("SUMMARY "))
    raise AssertionError("the notebook printed no SUMMARY line")


def check_rich_outputs(nb):
    tables = [h for h in outputs(nb, "text/html") if "<table class='spillway'>" in h]
    assert any("spillway run: transpose-sum" in h for h in tables), "no HTML report"
    assert outputs(nb, "image/png"), "no figure"
    # the progress bars were tqdm's notebook widgets, not text, and each ended full
    assert outputs(nb, "application/vnd.jupyter.widget-view+json"), "no progress widget"
    widgets = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"].values()
    bars = [w["state"] for w in widgets if w["model_name"] == "FloatProgressModel"]
    assert bars and all(b["value"] == b["max"] > 0 and b["bar_style"] == "success" for b in bars), bars


@contextlib.contextmanager
def shared_service(tmp_path: Path, *cluster_args: str):
    """A real `spillway serve` on loopback with a tenant; yields (url, token). The kernel
    finds the service's results directory in SPILLWAY_RESULTS_DIR (outputs are named
    relative to it)."""
    state = {"state_dir": str(tmp_path / "state")}
    token = add_tenant(state, "notebook")
    server = Server(state, *cluster_args).start()
    before = os.environ.get("SPILLWAY_RESULTS_DIR")
    os.environ["SPILLWAY_RESULTS_DIR"] = str(tmp_path / "state" / "results")
    try:
        yield server.url, token
    finally:
        if before is None:
            os.environ.pop("SPILLWAY_RESULTS_DIR", None)
        else:
            os.environ["SPILLWAY_RESULTS_DIR"] = before
        server.stop()


@pytest.mark.timeout(240)
def test_local_notebook_on_cpu(tmp_path, monkeypatch):
    # the kernel inherits the environment: CPU workers, and a free dashboard port on loopback
    monkeypatch.setenv("DASK_SPILLWAY__CPU", "true")
    monkeypatch.setenv("DASK_SPILLWAY__DASHBOARD_ADDRESS", "127.0.0.1:0")
    nb = execute("local.ipynb", tmp_path, cell_timeout=180)
    s = summary(nb)
    assert s["kind"] == "cpu" and s["n_workers"] >= 1
    assert s["input_bytes"] == 2000 * 2000 * 8 and s["rows_read"] == len(range(0, 2000, 7))
    check_rich_outputs(nb)


@pytest.mark.timeout(240)
def test_shared_service_notebook_on_cpu(tmp_path, monkeypatch):
    with shared_service(tmp_path, "--cpu", "--n-workers", "2") as (url, token):
        monkeypatch.setenv("SPILLWAY_URL", url)
        monkeypatch.setenv("SPILLWAY_TOKEN", token)
        nb = execute("shared_service.ipynb", tmp_path, cell_timeout=180)
    s = summary(nb)
    assert s["kind"] == "cpu" and s["workers"] == 2 and s["cancelled"]
    assert s["rel_error"] <= 1e-10 and s["rows"] == [len(range(0, 1500, 9)), 1500]
    assert s["array_module"] == "numpy"
    check_rich_outputs(nb)
    assert any("<b>spillway job " in h for h in outputs(nb, "text/html")), "no HTML job table"


# --- on the GPU host (2 GPUs): the same notebooks, unchanged, size their work from the GPUs


def two_gpus():
    from spillway.options.gpus import discover

    inventory = discover()
    if len(inventory) < 2:
        pytest.skip("needs two GPUs")
    return inventory


def report_line(capsys, what: str, s: dict):
    with capsys.disabled():
        print(f"\n{what}: {json.dumps(s)}", flush=True)


@pytest.mark.gpu
@pytest.mark.timeout(1200)
def test_local_notebook_on_two_gpus(tmp_path, monkeypatch, capsys):
    inventory = two_gpus()
    monkeypatch.setenv("DASK_SPILLWAY__DASHBOARD_ADDRESS", "127.0.0.1:0")
    nb = execute("local.ipynb", tmp_path, cell_timeout=900)
    s = summary(nb)
    report_line(capsys, "local notebook", s)
    assert s["kind"] == "gpu" and s["n_workers"] == len(inventory)
    # the workflow's input is larger than any one GPU's whole memory
    assert s["input_bytes"] > max(g.memory_total for g in inventory.gpus)
    assert s["rows_read"] > 0
    check_rich_outputs(nb)


@pytest.mark.gpu
@pytest.mark.timeout(1200)
def test_shared_service_notebook_on_two_gpus(tmp_path, monkeypatch, capsys):
    two_gpus()
    with shared_service(tmp_path, "--devices", "0,1") as (url, token):
        monkeypatch.setenv("SPILLWAY_URL", url)
        monkeypatch.setenv("SPILLWAY_TOKEN", token)
        nb = execute("shared_service.ipynb", tmp_path, cell_timeout=900)
    s = summary(nb)
    report_line(capsys, "shared-service notebook", s)
    assert s["kind"] == "gpu" and s["workers"] == 2 and s["cancelled"]
    assert s["rel_error"] <= 1e-10 and s["rows"] == [len(range(0, 20000, 9)), 20000]
    # this machine has a GPU, so the array result is read into CuPy chunks
    assert s["array_module"] == "cupy"
    check_rich_outputs(nb)
    assert any("<b>spillway job " in h for h in outputs(nb, "text/html")), "no HTML job table"


# --- the climatology notebook: xarray over a Zarr store on spillway's workers


@pytest.mark.timeout(240)
def test_climatology_notebook_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("DASK_SPILLWAY__CPU", "true")
    monkeypatch.setenv("DASK_SPILLWAY__DASHBOARD_ADDRESS", "127.0.0.1:0")
    nb = execute("climatology.ipynb", tmp_path, cell_timeout=180)
    s = summary(nb)
    assert s["kind"] == "cpu" and s["n_workers"] >= 1
    assert s["shape"] == [12, 73, 144] and s["store_bytes"] == 3 * 365 * 73 * 144 * 4
    assert s["array_module"] == "numpy" and s["rel_error"] <= 1e-5
    assert outputs(nb, "image/png"), "no figure"


#: the climatology's size on the GPU host: 8 years of a 0.25 degree grid, 12.1 GB of float32
GPU_YEARS = 8


@pytest.mark.gpu
@pytest.mark.timeout(900)
def test_climatology_notebook_on_one_gpu(tmp_path, monkeypatch, capsys):
    """12 GB written by xarray from CuPy chunks (sharded zstd), read back and decoded by
    one GPU, the climatology checked against NumPy float64."""
    from spillway.options.gpus import discover

    if not len(discover()):
        pytest.skip("needs a GPU")
    monkeypatch.setenv("DASK_SPILLWAY__DEVICES", str(discover().gpus[0].index))  # one GPU, whatever the host has
    monkeypatch.setenv("CLIMATOLOGY_YEARS", str(GPU_YEARS))
    monkeypatch.setenv("DASK_SPILLWAY__DASHBOARD_ADDRESS", "127.0.0.1:0")
    nb = execute("climatology.ipynb", tmp_path, cell_timeout=600)
    s = summary(nb)
    report_line(capsys, "climatology notebook", s)
    assert s["kind"] == "gpu" and s["n_workers"] == 1 and s["shape"] == [12, 721, 1440]
    assert s["store_bytes"] == GPU_YEARS * 365 * 721 * 1440 * 4 >= 12e9
    # the reduction ran on CuPy chunks read by spillway's GPU reader, every day's zstd frame
    # decoded by nvCOMP where it is installed
    assert s["array_module"] == "cupy" and s["rel_error"] <= 1e-5
    assert s["chunk_io"] and all(m.startswith("KvikIO") for m in s["chunk_io"]), s["chunk_io"]
    if importlib.util.find_spec("nvidia.nvcomp") is not None:
        assert s["frames_decoded_on_gpus"] >= GPU_YEARS * 365
    else:  # the reader said nvCOMP is missing and zarr decoded on the host: the same answer, checked above
        assert s["frames_decoded_on_gpus"] == 0
    assert outputs(nb, "image/png"), "no figure"
