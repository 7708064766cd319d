"""Nothing lost: SIGKILL the service with 20 jobs in mixed states, start it again.

The service attaches to a cluster kept up by `spillway up`, so the kill takes the service
process alone, as when it crashes, and the restart finds the same cluster.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from serve_helpers import Server, add_tenant, cpu_cluster, jobs_json, wait_for, wait_state

from reference_inputs import uniform_numpy

SMALL = {"size": "300x300", "chunks": "100x100"}
MEDIUM = {"size": "4500x4500", "chunks": "100x100"}  # long enough to be caught running under load
#: a wait for a job fails only where it makes no progress (no task done, no change of
#: state) for this long, however long the job itself takes on a loaded machine
STALL_S = 120


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with cpu_cluster(tmp_path_factory.mktemp("cluster")) as scheduler_file:
        yield scheduler_file


def submit(client, params, **body):
    r = client.post("/jobs", json={"workflow": "transpose-sum", "params": params, **body})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def wait_while_it_progresses(client, job_id: str, states: set[str]) -> dict:
    """The job once it reaches one of ``states``; fails where it stalls for ``STALL_S``."""
    last, since = None, time.monotonic()
    while True:
        job = client.get(f"/jobs/{job_id}").json()
        if job["state"] in states:
            return job
        seen = (job["state"], job.get("attempts"), (job.get("progress") or {}).get("tasks_done"))
        if seen != last:
            last, since = seen, time.monotonic()
        assert time.monotonic() - since < STALL_S, f"job {job_id} made no progress for {STALL_S} s: {job}"
        time.sleep(0.5)


def expected_sum(n: int, seed: int) -> float:
    a = uniform_numpy((n, n), seed=seed, dtype="float64").astype(np.float64)
    return float((a + a.T).sum())


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the waits below follow the jobs' progress, not a fixed time
def test_sigkill_and_restart_loses_nothing(cluster, db_state):
    tokens = {name: add_tenant(db_state, name, "--max-running", "1") for name in ("t1", "t2")}
    admin_token = add_tenant(db_state, "root", "--admin")
    server = Server(db_state, "--scheduler-file", cluster).start()
    try:
        t1, t2 = server.client(tokens["t1"]), server.client(tokens["t2"])
        done = [submit(c, SMALL) for c in (t1, t1, t2, t2)]
        for job_id in done[:2]:
            wait_state(t1, job_id, "done")
        for job_id in done[2:]:
            wait_state(t2, job_id, "done")
        # different seeds: identical jobs would share their tasks on the cluster
        running = [submit(t1, MEDIUM), submit(t2, {**MEDIUM, "seed": 1})]
        t1_queued = [submit(t1, SMALL, idempotency_key=f"q{i}") for i in range(7)]
        t2_queued = [submit(t2, SMALL) for _ in range(7)]
        cancelled = t1_queued[:2] + t2_queued[-1:]
        for client, job_id in [(t1, cancelled[0]), (t1, cancelled[1]), (t2, cancelled[2])]:
            assert client.post(f"/jobs/{job_id}/cancel").json()["state"] == "cancelled"
        queued = t1_queued[2:] + t2_queued[:-1]
        with server.client(admin_token) as admin:
            wait_for(lambda: all(admin.get(f"/jobs/{j}").json()["progress"]["tasks_done"] > 0 for j in running),
                     STALL_S, "both medium jobs to be running")
            before = {j["id"]: j for j in jobs_json(admin)}
        assert len(before) == 20
        states = [before[j]["state"] for j in done + running + queued + cancelled]
        assert states == ["done"] * 4 + ["running"] * 2 + ["queued"] * 11 + ["cancelled"] * 3
        results_before = {j: t1.get(f"/jobs/{j}/result").json() if before[j]["tenant"] == "t1"
                          else t2.get(f"/jobs/{j}/result").json() for j in done}
        t1.close()
        t2.close()
    finally:
        server.kill()

    server = Server(db_state, "--scheduler-file", cluster).start()
    try:
        with server.client(admin_token) as admin:
            after = {j["id"]: j for j in jobs_json(admin)}
            assert set(after) == set(before)
            for job_id in done:
                assert after[job_id]["state"] == "done"
                assert admin.get(f"/jobs/{job_id}/result").json() == results_before[job_id]
            for job_id in cancelled:
                assert after[job_id]["state"] == "cancelled"
            for job_id in running + queued:
                assert after[job_id]["state"] in ("queued", "running", "done")
            # everything that was waiting or running finishes, correctly
            for job_id in running + queued:
                job = wait_while_it_progresses(admin, job_id, {"done", "failed"})
                assert job["state"] == "done", job
            for job_id in running:
                job = admin.get(f"/jobs/{job_id}").json()
                assert job["attempts"] == 2
                lines = [x["line"] for x in admin.get(f"/jobs/{job_id}/logs").json()["lines"]]
                assert any("service restarted while running" in line for line in lines)
            for job_id, seed in zip(running, (0, 1)):
                got = admin.get(f"/jobs/{job_id}/result").json()["summary"]["sum"]
                assert abs(got - expected_sum(4500, seed)) / expected_sum(4500, seed) < 1e-10
            for job_id in queued:
                assert admin.get(f"/jobs/{job_id}").json()["attempts"] == 1
            # an idempotent retry after the restart still finds its job
            retry = server.client(tokens["t1"]).post(
                "/jobs", json={"workflow": "transpose-sum", "params": SMALL, "idempotency_key": "q3"})
            assert retry.status_code == 200 and retry.json()["id"] == t1_queued[3]
    finally:
        server.stop()
