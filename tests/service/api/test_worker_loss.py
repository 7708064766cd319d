"""Workers SIGKILLed during a job of a real `spillway serve --cpu --n-workers 2` on
127.0.0.1: the job fails within seconds with one line naming the lost worker and why (its
nanny's word), never with a CommClosedError from the service's own calls to the workers, and
never by Dask recomputing the lost part in silence."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from distributed import Client
from serve_helpers import Server, add_tenant, owner_client, wait_for, wait_state


PARAMS = {"size": "3000x3000", "chunks": "100x100", "seed": 3}


def _worker_pids(server: Server, owner: Client) -> dict[str, int]:
    """Worker address -> pid, asked of the scheduler; each pid checked to be a process this
    test's server started."""
    pids = owner.run(os.getpid)
    ours = {p.pid for p in psutil.Process(server.proc.pid).children(recursive=True)}
    assert pids and set(pids.values()) <= ours, (pids, ours)
    return pids


def _start(tmp_path) -> tuple[Server, str]:
    state = {"state_dir": str(tmp_path / "state")}
    token = add_tenant(state, "eve")
    server = Server(state, "--cpu", "--n-workers", "2").start()
    return server, token


def _run_and_kill(tmp_path, n_kill: int):
    server, token = _start(tmp_path)
    try:
        with server.client(token) as c, owner_client(server.state["state_dir"]) as owner:
            job = c.post("/jobs", json={"workflow": "transpose-sum", "params": PARAMS, "verify": True}).json()
            wait_for(lambda: c.get(f"/jobs/{job['id']}").json()["progress"]["tasks_done"] > 50, 90,
                     "the job to be under way")
            pids = _worker_pids(server, owner)
            victims = sorted(pids.items())[:n_kill]
            assert c.get(f"/jobs/{job['id']}").json()["state"] == "running"
            for _, pid in victims:
                os.kill(pid, signal.SIGKILL)
            end = wait_state(c, job["id"], {"done", "failed", "cancelled"}, timeout=180)
            logs = [line["line"] for line in c.get(f"/jobs/{job['id']}/logs").json()["lines"]]
            result = c.get(f"/jobs/{job['id']}/result").json() if end["state"] == "done" else None
            wait_for(lambda: len(owner.scheduler_info()["workers"]) == 2, 60, "the workers to restart")
            return end, logs, result, [addr for addr, _ in victims]
    finally:
        server.stop()


def _check_failed(end: dict, logs: list[str], victims: list[str]) -> str:
    assert end["state"] == "failed", (end, logs)
    error = end["error"]
    assert "\n" not in error
    assert "CommClosedError" not in error and "Broadcast" not in error, error
    # one line: the first worker lost, and why (its nanny told the scheduler)
    assert error.startswith("WorkerLost: worker "), error
    assert any(f"worker {v} (pid " in error for v in victims), error
    assert error.endswith("died: killed by SIGKILL (the kernel's OOM killer? see dmesg)"), error
    return error


@pytest.mark.slow
def test_one_worker_killed_fails_the_job_naming_it(tmp_path):
    """Dask would recompute the lost part on the restarted worker, saying nothing (on one
    GPU: the whole run, into the same OOM kill): the job fails at once instead."""
    end, logs, result, victims = _run_and_kill(tmp_path, 1)
    _check_failed(end, logs, victims)
    assert any("failed: WorkerLost: worker " in line for line in logs), logs


@pytest.mark.slow
def test_both_workers_killed_fail_the_job_naming_one(tmp_path):
    end, logs, result, victims = _run_and_kill(tmp_path, 2)
    _check_failed(end, logs, victims)


@pytest.mark.slow
def test_both_workers_killed_without_retries_fails_naming_them(tmp_path, monkeypatch):
    # no task may be retried after its worker died: Dask fails the tasks (KilledWorker);
    # the job still says the loss first
    monkeypatch.setenv("DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES", "0")
    end, logs, result, victims = _run_and_kill(tmp_path, 2)
    error = _check_failed(end, logs, victims)
    assert "https://" not in error, error
