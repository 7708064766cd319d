"""A worker killed during a job: the job ends correct (Dask recomputes the lost chunks)
or failed with a clear error, never done with a wrong result."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from distributed import Client
from serve_helpers import Server, add_tenant, cpu_cluster, wait_for, wait_state

from reference_inputs import uniform_numpy

PARAMS = {"size": "3000x3000", "chunks": "100x100", "seed": 3}


@pytest.mark.slow
def test_worker_killed_mid_job(tmp_path):
    state = {"state_dir": str(tmp_path / "state")}
    token = add_tenant(state, "eve")
    with cpu_cluster(tmp_path) as scheduler_file:
        server = Server(state, "--scheduler-file", scheduler_file).start()
        try:
            with server.client(token) as c, Client(scheduler_file=scheduler_file, timeout="20s") as owner:
                job = c.post("/jobs", json={"workflow": "transpose-sum", "params": PARAMS, "verify": True}).json()
                wait_for(lambda: c.get(f"/jobs/{job['id']}").json()["progress"]["tasks_done"] > 50, 60,
                         "the job to be under way")
                pids = owner.run(os.getpid)
                victim_addr, victim = sorted(pids.items())[0]
                os.kill(victim, signal.SIGKILL)
                end = wait_state(c, job["id"], {"done", "failed"}, timeout=120)
                if end["state"] == "done":
                    result = c.get(f"/jobs/{job['id']}/result").json()
                    a = uniform_numpy((3000, 3000), seed=3, dtype="float64").astype(np.float64)
                    expected = float((a + a.T).sum())
                    assert abs(result["summary"]["sum"] - expected) / abs(expected) < 1e-10
                    assert result["report"]["verify"]["ok"] is True
                else:
                    assert end["error"] and ("worker" in end["error"].lower() or "Killed" in end["error"])
                # the nanny brought a worker back; the job saw it go
                wait_for(lambda: len(owner.scheduler_info()["workers"]) == 2, 60, "the worker to restart")
                assert victim_addr not in owner.scheduler_info()["workers"] or owner.run(os.getpid) != pids
                print("worker killed mid-job: job ended", end["state"], end.get("error") or "")
        finally:
            server.stop()
