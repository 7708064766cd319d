"""Workers SIGKILLed during a job of a real `spillway serve --cpu --n-workers 2` on
127.0.0.1: the job recovers (Dask recomputes on the restarted workers) or fails with one line
naming the lost workers and why, never with a CommClosedError from the service's own calls to
the workers; with one worker killed the job recovers and its log names the lost worker."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from distributed import Client
from serve_helpers import Server, add_tenant, wait_for, wait_state

from reference_inputs import uniform_numpy

PARAMS = {"size": "3000x3000", "chunks": "100x100", "seed": 3}


def _expected_sum() -> float:
    a = uniform_numpy((3000, 3000), seed=3, dtype="float64").astype(np.float64)
    return float((a + a.T).sum())


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
        scheduler_file = str(Path(server.state["state_dir"]) / "scheduler.json")
        with server.client(token) as c, Client(scheduler_file=scheduler_file, timeout="20s") as owner:
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


@pytest.mark.slow
def test_one_worker_killed_job_recovers_and_its_log_names_it(tmp_path):
    end, logs, result, victims = _run_and_kill(tmp_path, 1)
    assert end["state"] == "done", (end, logs)
    expected = _expected_sum()
    assert abs(result["summary"]["sum"] - expected) / abs(expected) < 1e-10
    assert result["report"]["verify"]["ok"] is True
    lost = [line for line in logs if "lost" in line]
    assert any(victims[0] in line for line in lost), logs
    assert any("signal 9" in line for line in lost), logs


@pytest.mark.slow
def test_both_workers_killed_job_recovers_or_names_the_lost_workers(tmp_path):
    end, logs, result, victims = _run_and_kill(tmp_path, 2)
    print("both workers killed: job ended", end["state"], end.get("error") or "", logs)
    if end["state"] == "done":
        expected = _expected_sum()
        assert abs(result["summary"]["sum"] - expected) / abs(expected) < 1e-10
        lost = " ".join(line for line in logs if "lost" in line)
        assert all(v in lost for v in victims), logs
    else:
        assert end["state"] == "failed", (end, logs)
        error = end["error"]
        assert "\n" not in error
        assert "CommClosedError" not in error and "Broadcast" not in error, error
        assert all(v in error for v in victims), error
        assert "signal 9" in error or "out of memory" in error, error


@pytest.mark.slow
def test_both_workers_killed_without_retries_fails_naming_them(tmp_path, monkeypatch):
    # no task may be retried after its worker died: the job must fail, and say why
    monkeypatch.setenv("DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES", "0")
    end, logs, result, victims = _run_and_kill(tmp_path, 2)
    assert end["state"] == "failed", (end, logs)
    error = end["error"]
    assert "\n" not in error
    assert "CommClosedError" not in error and "Broadcast" not in error, error
    # the loss first, each worker with its reason, then Dask's word on the failed task
    assert error.startswith("WorkerLost: workers lost: "), error
    assert all(f"{v} (killed by signal 9)" in error for v in victims), error
    assert "KilledWorker" in error and "https://" not in error, error
    print("both workers killed, no retries:", error)
