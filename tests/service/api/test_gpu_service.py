"""Two tenants' jobs sharing the GPUs of one host through the service (GPU host only)."""

from __future__ import annotations

import pytest
from serve_helpers import Server, add_tenant, wait_state

pytestmark = pytest.mark.gpu

#: 6.4 GB of float32 per job: long enough on H200s for the jobs to overlap
PARAMS = {"size": "40000x40000", "chunks": "5000x5000", "dtype": "float32"}


def test_two_tenants_share_two_gpus(tmp_path, gpu_count):
    if gpu_count < 2:
        pytest.skip(f"needs 2 GPUs, found {gpu_count}")
    state = {"state_dir": str(tmp_path / "state")}
    tokens = {name: add_tenant(state, name, "--max-running", "2") for name in ("lab-a", "lab-b")}
    admin = add_tenant(state, "ops", "--admin")  # /metrics
    server = Server(state, "--devices", "0,1").start()
    try:
        clients = {name: server.client(token) for name, token in tokens.items()}
        with server.client(admin) as ops:
            health = ops.get("/healthz").json()
            assert health["kind"] == "gpu" and health["workers"] == 2
        jobs = []
        for seed in range(2):
            for name, c in clients.items():
                r = c.post("/jobs", json={"workflow": "transpose-sum", "params": {**PARAMS, "seed": seed},
                                          "verify": seed == 0})
                assert r.status_code == 201, r.text
                jobs.append((name, r.json()["id"]))
        ends = {job_id: wait_state(clients[name], job_id, {"done", "failed"}, timeout=600) for name, job_id in jobs}
        for job_id, end in ends.items():
            assert end["state"] == "done", end
        reports = {job_id: clients[name].get(f"/jobs/{job_id}/result").json()["report"] for name, job_id in jobs}
        for report in reports.values():
            assert report["cluster"]["kind"] == "gpu" and report["cluster"]["n_workers"] == 2
            assert len(report["peak_bytes_per_worker"]) == 2
            assert all(v and v > 0 for v in report["peak_bytes_per_worker"].values())
            if report["verify"]:
                assert report["verify"]["ok"] is True, report["verify"]
        # the two tenants' jobs ran at the same time on the same GPUs
        a = [ends[j] for n, j in jobs if n == "lab-a"]
        b = [ends[j] for n, j in jobs if n == "lab-b"]
        overlap = any(x["timings"]["started"] < y["timings"]["finished"] and
                      y["timings"]["started"] < x["timings"]["finished"] for x in a for y in b)
        assert overlap, [(j["timings"]["started"], j["timings"]["finished"]) for j in a + b]
        with server.client(admin) as anon:
            metrics = anon.get("/metrics").text
        assert metrics.count("spillway_gpu_memory_total_bytes{") == 2
        print("two tenants on 2 GPUs:", {j: (e["tenant"], e["timings"]["started"], e["timings"]["finished"],
                                             e["timings"]["wall_s"]) for j, e in ends.items()})
        for c in clients.values():
            c.close()
    finally:
        server.stop()
