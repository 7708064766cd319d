"""A small job through the real HTTP service on ONE GPU, by a tenant added with no options,
and the memory figures of its report: RMM's device peak within the GPU, the worker's host
peak within the machine, the bytes moved per tier, the transport; /metrics shows the
tiers' bytes (GPU host only; `bash benchmarks/gpu-host/gpu-tests.sh 4` runs it there)."""

from __future__ import annotations

import re

import numpy as np
import psutil
import pytest
from serve_helpers import Server, add_tenant

from reference_inputs import uniform_numpy
import spillway
from spillway.options.gpus import discover
from spillway.workflows.workflow import relative_error

pytestmark = pytest.mark.gpu

SHAPE, SEED = (20000, 20000), 3


@pytest.mark.timeout(400)
def test_a_job_through_the_service_on_one_gpu_reports_its_memory(tmp_path):
    state = {"state_dir": str(tmp_path / "state")}
    token = add_tenant(state, "one")
    admin = add_tenant(state, "ops", "--admin")  # /metrics
    server = Server(state, "--devices", "0").start()
    try:
        with spillway.connect(server.url, token) as service:
            assert service.health()["kind"] == "gpu" and service.health()["workers"] == 1
            job = service.submit("transpose-sum", size=f"{SHAPE[0]}x{SHAPE[1]}", chunks="5000x5000", seed=SEED,
                                 verify=True)
            result = job.result(timeout=300)
            assert job.status()["waiting"] is None and job.state == "done"
        report = result.report
        assert report["verify"]["ok"] is True, report["verify"]
        x = uniform_numpy(SHAPE, seed=SEED, dtype="float64").astype(np.float64)
        assert relative_error(np.float64(result.summary["sum"]), (x + x.T).sum()) <= 1e-10
        assert report["cluster"]["kind"] == "gpu" and report["cluster"]["n_workers"] == 1
        gpu = discover().gpus[0]
        # device: RMM's allocations, at least a chunk's input and result, within the GPU
        assert report["memory_measure"] == "rmm"
        (device_peak,) = report["peak_bytes_per_worker"].values()
        assert 2 * 5000 * 5000 * 8 <= device_peak <= gpu.memory_total, device_peak
        # host: the worker process's resident memory, more than an empty interpreter, within the machine
        (host_peak,) = report["peak_host_bytes_per_worker"].values()
        assert 100 * 2**20 < host_peak < psutil.virtual_memory().total, host_peak
        # bytes moved per tier and where the data went, as `spillway run` reports them
        assert set(report["spilled_by_tier"]) >= {"device_to_host", "host_to_device"}
        assert all(v >= 0 for v in report["spilled_by_tier"].values())
        assert report["spill"] is not None and len(report["spill"]) == 1
        assert "transport" in report and report["wall_s"] > 0
        assert "peak host" in str(result.report)  # the text form shows both peaks
        with server.client(admin) as anon:
            metrics = anon.get("/metrics").text
        for tier in ("device", "host", "disk"):
            assert re.search(rf'^spillway_tier_bytes{{tier="{tier}"}} \d', metrics, re.M), tier
        assert metrics.count("spillway_gpu_memory_total_bytes{") == 1
    finally:
        server.stop()
