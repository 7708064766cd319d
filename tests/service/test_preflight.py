"""`spillway run` refuses what no GPU worker's tiers could hold before the cluster starts,
with the same numbers the running cluster would give."""

from __future__ import annotations

import importlib
import time

import pytest
from click.testing import CliRunner
from stand_ins import h200_host, host_probe

from spillway.service import preflight
from spillway.service.cli import main
from spillway.service.errors import AdmissionError
from spillway.service.launch.spec import HostFacts, worker_specs
from spillway.service.options import Options

# the module, not the function the package exports under its name
plan_module = importlib.import_module("spillway.service.launch.plan")

GB = 10**9
HOST = 128 * 2**30


@pytest.fixture
def one_h200(monkeypatch):
    """This machine seen as one H200 with the CUDA stack, 128 GiB of memory; nothing may start."""
    import spillway.service.gpus as gpus
    import spillway.service.launch as launch

    monkeypatch.setattr(gpus, "discover", lambda: h200_host(1))
    probe = host_probe(have_ucxx=False, have_cuda_stack=True, host_memory=HOST)
    monkeypatch.setattr(plan_module.HostProbe, "here", classmethod(lambda cls: probe))
    monkeypatch.setattr(HostFacts, "here", classmethod(lambda cls: HostFacts(HOST, HOST)))

    def no_cluster(*a, **k):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(launch, "start_cluster", no_cluster)


def test_planned_capacity_is_what_the_specs_hold(tmp_path):
    options = Options.resolve(device_memory_limit="100GB", local_directory=str(tmp_path))
    launch = plan_module.plan(options, h200_host(2), host_probe(have_ucxx=False, have_cuda_stack=True,
                                                                  host_memory=HOST))
    specs = worker_specs(options, launch, HostFacts(HOST, HOST))
    target, capacity = preflight.planned(specs, launch.device_memory, str(tmp_path), HOST)
    assert capacity.device_bytes == 200 * GB and target.worker_bytes == 100 * GB and target.n_workers == 2
    assert capacity.host_bytes == sum(s.host_limit for s in specs) > 0
    assert 0 < capacity.disk_bytes < capacity.disk_free_bytes


def test_no_device_limit_counts_the_whole_gpu(tmp_path):
    options = Options.resolve(device_memory_limit=0, local_directory=str(tmp_path))
    launch = plan_module.plan(options, h200_host(1), host_probe(have_ucxx=False, have_cuda_stack=True,
                                                                  host_memory=HOST))
    specs = worker_specs(options, launch, HostFacts(HOST, HOST))
    target, capacity = preflight.planned(specs, launch.device_memory, None, HOST)
    assert capacity.device_bytes == 141 * GB == target.worker_bytes


def test_a_run_past_every_tier_is_refused_before_the_cluster_starts(one_h200, tmp_path):
    start = time.perf_counter()
    result = CliRunner().invoke(main, ["run", "svd", "--param", "size=190000000x500",
                                       "--local-directory", str(tmp_path)])
    took = time.perf_counter() - start
    assert result.exit_code == 3, result.output
    line = result.output.strip().splitlines()[-1]
    assert "svd: projected footprint" in line and "exceeds the cluster's device + host + disk capacity" in line
    assert took < 5, took


def test_a_run_that_fits_is_not_refused(one_h200, tmp_path):
    options = Options.resolve(local_directory=str(tmp_path))
    preflight.refuse_before_start(options, "svd", {"size": "1000000x500"})  # 4 GB: nothing raised
    with pytest.raises(AdmissionError, match="projected footprint"):
        preflight.refuse_before_start(options, "svd", {"size": "190000000x500"})


def test_cpu_and_attached_clusters_are_left_to_the_running_check():
    preflight.refuse_before_start(Options.resolve(cpu=True), "svd", {"size": "190000000x500"})
    preflight.refuse_before_start(Options.resolve(scheduler_address="tcp://127.0.0.1:1"), "svd",
                                  {"size": "190000000x500"})
