"""The GPU worker's set-up order (UCX before the store's CUDA context), the store spec the
launchers share, and `spillway worker`'s node: its keywords from the options, and nannies
really handing spillway's tiered store to the worker processes they start (on CPU, with
NumPy in the device tier's place)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from spillway.cli import main
from spillway.options.errors import OptionsError
from spillway.options.gpus import Inventory
from spillway.launch import gpu_worker, worker_store
from spillway.launch.plan import PINNED_HOST_FRACTION, plan
from spillway.options.settings import Options
from stand_ins import gpu_cluster_kwargs, h200_host, host_probe, node_spec

HOST = 2 * 10**12
#: a host with UCX and the CUDA stack and HOST bytes of memory
UCX_HOST = host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=HOST)


inventory = h200_host


@pytest.mark.parametrize("protocol, steps", [
    ("ucx", ("comm", "store")), ("ucxx", ("comm", "store")), ("ucx://10.0.0.1:0", ("comm", "store")),
    ("tcp", ("store",)), ("tls", ("store",)),
])
def test_ucx_starts_before_the_store_makes_a_cuda_context(protocol, steps):
    assert worker_store.setup_steps(protocol) == steps


@pytest.mark.parametrize("protocol, calls", [("ucx", ["ucx", "store"]), ("tcp", ["store"])])
def test_build_store_runs_the_steps_in_that_order(monkeypatch, protocol, calls):
    seen = []
    monkeypatch.setattr(worker_store, "start_ucx", lambda: seen.append("ucx"))
    monkeypatch.setattr(worker_store, "tiered_store", lambda **kw: seen.append("store") or kw)
    built = worker_store.build_store(worker_local_directory="/w", protocol=protocol, host_limit=5)
    assert seen == calls
    assert built == {"worker_local_directory": "/w", "host_limit": 5}  # protocol is not the store's


def test_the_local_gpu_cluster_passes_the_shared_store_spec():
    opts = Options.resolve(pinned_pool_size="8GB")
    p = plan(opts, inventory(2), host=UCX_HOST)
    func, kwargs = gpu_cluster_kwargs(opts, p)["data"]
    assert func is worker_store.build_store
    assert kwargs["protocol"] == "ucx" and kwargs["pinned_pool_size"] == 8 * 10**9
    assert kwargs["pinned_limit"] == int(PINNED_HOST_FRACTION * HOST) // 2


def test_node_plan_is_one_worker_per_visible_gpu_whatever_the_job_totals():
    opts = Options.resolve(scheduler_file="/s.json", n_workers=8, protocol="ucx")
    node = gpu_worker.node_plan(opts, inventory(4), host=UCX_HOST)
    assert node.kind == "gpu" and node.n_workers == 4 and node.devices == (0, 1, 2, 3)
    assert node.protocol == "ucx" and node.pinned_limit == int(PINNED_HOST_FRACTION * HOST) // 4


@pytest.mark.parametrize("options, inv, fragment", [
    (dict(scheduler_file="/s.json"), inventory(0), "worker: no GPU found (test: no NVML)"),
    (dict(scheduler_file="/s.json", cpu=True), inventory(2), "worker: cpu is true"),
])
def test_node_without_gpu_workers_is_one_line_error(options, inv, fragment):
    if not len(inv):
        inv = Inventory((), None, None, "test: no NVML")
    with pytest.raises(OptionsError) as e:
        gpu_worker.node_plan(Options.resolve(**options), inv, host=host_probe(have_ucxx=True, have_cuda_stack=True))
    assert str(e.value).startswith(fragment) and "\n" not in str(e.value)


def test_worker_keywords_come_from_the_options():
    opts = Options.resolve(scheduler_file="/s.json", protocol="ucx", rmm_pool_size="100GB",
                           device_memory_limit="120GB", memory_limit="200GB", threads_per_worker=2,
                           pinned_pool_size="48GB", local_directory="/scratch")
    node = gpu_worker.node_plan(opts, inventory(4), host=UCX_HOST)
    spec = node_spec(opts, inventory(4), host=UCX_HOST)
    kw = gpu_worker.worker_kwargs(opts, spec, death_timeout=60)
    assert kw["scheduler_file"] == "/s.json" and "scheduler" not in kw
    assert kw["protocol"] == "ucx" and kw["enable_nvlink"] is True and kw["death_timeout"] == 60
    assert kw["nthreads"] == 2 and kw["memory_limit"] == 200 * 10**9
    assert kw["rmm_pool_size"] == 100 * 10**9 and kw["rmm_allocator_external_lib_list"] == ["cupy"]
    assert kw["device_memory_limit"] == 120 * 10**9 and kw["local_directory"] == "/scratch"
    func, store = kw["data"]
    assert func is worker_store.build_store
    assert store == {"protocol": "ucx", "device_memory_limit": 120 * 10**9,
                     "host_limit": spec.host_limit, "pinned_pool_size": 48 * 10**9,
                     "pinned_limit": node.pinned_limit, "memory_limit": 200 * 10**9}


def test_dask_cuda_store_keeps_dask_cuda_data():
    opts = Options.resolve(scheduler_address="tcp://h:8786", protocol="tcp", memory_store="dask-cuda")
    spec = node_spec(opts, inventory(2), host=UCX_HOST)
    kw = gpu_worker.worker_kwargs(opts, spec)
    assert kw["scheduler"] == "tcp://h:8786" and "data" not in kw and "enable_nvlink" not in kw


def test_importing_the_worker_module_imports_no_gpu_library():
    import subprocess
    import sys

    code = ("import sys, spillway.launch.gpu_worker as g; "
            "print(sorted(m for m in ('cupy', 'rmm', 'dask_cuda') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def numpy_store(*, worker_local_directory, device_limit, host_limit):
    """spillway's tiered store with NumPy in the device tier's place (CPU workers)."""
    from numpy_codec import NumpyCodec
    from spillway.memory.disk import DiskTier
    from spillway.memory.store import TieredStore

    return TieredStore(device_limit=device_limit, host_limit=host_limit, codec=NumpyCodec(),
                       below=[DiskTier(worker_local_directory)])


@pytest.mark.timeout(120)
def test_nannies_hand_the_tiered_store_to_their_workers(tmp_path):
    """What TieredCUDAWorker does to dask-cuda's nannies, on distributed's own nannies:
    built with distributed's store, given spillway's before they start."""
    import asyncio

    import dask.array as da
    import numpy as np
    from distributed import Client, LocalCluster, Nanny

    async def main():
        async with LocalCluster(n_workers=0, processes=False, protocol="tcp", host="127.0.0.1",
                                dashboard_address=None, asynchronous=True) as cluster:
            nannies = [Nanny(cluster.scheduler_address, nthreads=1, host="127.0.0.1", dashboard=False,
                             local_directory=str(tmp_path / f"w{i}")) for i in range(2)]
            gpu_worker.use_store(nannies, (numpy_store, {"device_limit": 2**20, "host_limit": 2**20}))
            async with nannies[0], nannies[1], Client(cluster, asynchronous=True) as client:
                kinds = await client.run(lambda dask_worker: type(dask_worker.data).__name__)
                assert sorted(kinds.values()) == ["TieredStore", "TieredStore"]
                x = client.persist(da.arange(600_000, chunks=100_000, dtype="float64"))  # 4.8 MB
                assert await client.compute(x.sum()) == np.arange(600_000, dtype="float64").sum()
                tiers = await client.run(lambda dask_worker: [dask_worker.data.tier_of(k) for k in dask_worker.data])
                # 1 MB device and 1 MB host tiers each: the store spilled some chunks to its disk
                assert "disk" in sum(tiers.values(), [])

    asyncio.run(main())


def test_use_store_refuses_a_nanny_without_worker_keywords():
    with pytest.raises(RuntimeError, match="use memory-store dask-cuda"):
        gpu_worker.use_store([object()], (numpy_store, {}))


def test_worker_command_needs_a_scheduler_and_a_gpu():
    result = CliRunner().invoke(main, ["worker"])
    assert result.exit_code == 2 and "--scheduler-file or --scheduler-address" in result.output
    result = CliRunner().invoke(main, ["worker", "--scheduler-file", "/nonexistent.json", "--cpu"])
    assert result.exit_code == 2
    assert result.output.strip().startswith("spillway: error: worker: cpu is true")


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_gpu_run_json_is_clean(gpu_count):
    """On the GPU host: `spillway run --json` on every GPU (UCX between two or more) prints
    one JSON object, and its stderr has none of the three start/close warnings."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "spillway", "run", "transpose-sum", "--param", "size=8000x8000",
                          "--param", "chunks=2000x2000", "--verify", "--json", "--dashboard-address", ""],
                         capture_output=True, text=True, timeout=540)
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads(out.stdout)
    assert report["verify"]["ok"] and report["cluster"]["n_workers"] == gpu_count
    assert report["spill"] is not None  # the tiered store
    for warning in ("A CUDA context for device", "unused environment variable", "still alive after"):
        assert warning not in out.stderr, out.stderr[-4000:]
