"""A worker killed during a job on an attached cluster: the job fails at once with one line
naming the worker and why (never Dask recomputing the lost chunks in silence), and the
cluster carries on."""

from __future__ import annotations

import os
import signal

import pytest
from distributed import Client
from serve_helpers import Server, add_tenant, cpu_cluster, wait_for, wait_state


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
                # the nannies of the attached cluster (another process) told the scheduler why
                assert end["state"] == "failed", end
                assert end["error"] == (f"WorkerLost: worker {victim_addr} (pid {victim}) died: "
                                        "killed by SIGKILL (the kernel's OOM killer? see dmesg)"), end["error"]
                # the nanny brought a worker back; the job saw it go
                wait_for(lambda: len(owner.scheduler_info()["workers"]) == 2, 60, "the worker to restart")
                assert victim_addr not in owner.scheduler_info()["workers"] or owner.run(os.getpid) != pids
                print("worker killed mid-job: job ended", end["state"], end.get("error") or "")
        finally:
            server.stop()
