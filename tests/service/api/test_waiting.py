"""Why a queued job waits, in words: the queue's rules said (pure), and a job larger than
the workers' memory on a real CPU cluster running alone while the next one says it waits
for memory, both finishing correct, one after the other."""

from __future__ import annotations

import os
import time

import pytest

from spillway.service.jobdb import JobDB
from spillway.service.jobs.order import memory_reason, waiting_reasons
from spillway.service.jobs.queue import JobQueue
from spillway.launch import open_cluster
from spillway.options.settings import Options

GiB = 2**30


def row(job_id, tenant, *, footprint=10, created="1", max_running=2, priority=0):
    return {"id": job_id, "tenant_id": tenant, "priority": priority, "tenant_priority": 0,
            "tenant_max_running": max_running, "tenant_revoked": False, "cancel_requested": False,
            "footprint_bytes": footprint, "timings": {"created": created}}


def test_memory_reason_names_what_runs_and_what_it_needs():
    running = [row("a" * 32, 1, footprint=int(203.38 * GiB))]
    big = row("b" * 32, 2, footprint=int(203.38 * GiB))
    text = memory_reason(big, running, int(63.7 * GiB))
    assert text.startswith("waiting for memory: 1 running job holds 203.38 GiB of the workers' 63.70 GiB; "
                           "this job needs 203.38 GiB"), text
    assert text.endswith("more than the workers' memory, so it runs alone (spilling) once they end")
    two = memory_reason(row("c", 3, footprint=40), [row("a", 1, footprint=50), row("b", 2, footprint=30)], 100)
    assert two == ("waiting for memory: 2 running jobs hold 80 B of the workers' 100 B; this job needs 40 B "
                   "and starts when 20 B more is free")


def test_each_queued_job_gets_its_reason():
    running = [row("run", 1, footprint=80)]
    queued = [row("big", 2, footprint=50, created="1"), row("small", 3, footprint=5, created="2"),
              row("quota", 1, footprint=5, created="3", max_running=1)]
    reasons = waiting_reasons(queued, running, 100)
    assert reasons["big"].startswith("waiting for memory: 1 running job holds 80 B")
    assert reasons["small"] == f"waiting behind job big (it starts first: {reasons['big']})"
    assert reasons["quota"] == "waiting for its tenant's running jobs: 1 of at most 1 running"
    # nothing runs: the head starts on the loop's next pass whatever its size
    assert waiting_reasons([row("huge", 2, footprint=10**6)], [], 100) == {"huge": "starting"}


@pytest.fixture(scope="module")
def session():
    with open_cluster(Options.resolve(cpu=True, n_workers=1, dashboard_address="")) as s:
        yield s


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_job_past_the_workers_memory_runs_alone_and_the_next_waits(session, tmp_path):
    jobdb = JobDB(f"sqlite:///{tmp_path / 'jobs.db'}")
    sched = JobQueue(jobdb, session, results_dir=str(tmp_path / "results"), poll_s=0.05)
    os.makedirs(sched.results_dir, exist_ok=True)
    params = {"size": "3000x3000", "chunks": "100x100"}
    footprint = sched.footprint("transpose-sum", params)
    # the workers hold less than one job: each runs alone, the other waits for memory
    sched.worker_memory = lambda: footprint - 1
    ids = []
    for name in ("ann", "ben"):
        tenant, _ = jobdb.add_tenant(name)
        job, _ = jobdb.submit(tenant, workflow="transpose-sum", params=params, verify=True, priority=0,
                              idempotency_key=None, footprint_bytes=footprint)
        ids.append(job["id"])
    sched.start()
    try:
        seen = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and seen is None:
            jobs = [jobdb.job(i) for i in ids]
            if any(j["state"] == "running" for j in jobs):
                waiting = [sched.waiting_reason(j) for j in jobs if j["state"] == "queued"]
                seen = next((w for w in waiting if w and w.startswith("waiting for memory")), None)
            time.sleep(0.05)
        assert seen is not None, [jobdb.job(i) for i in ids]
        assert seen.startswith(f"waiting for memory: 1 running job holds {_fmt(footprint)}"), seen
        assert "runs alone" in seen
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and any(jobdb.job(i)["state"] in ("queued", "running") for i in ids):
            time.sleep(0.1)
        first, second = sorted((jobdb.job(i) for i in ids), key=lambda j: j["timings"]["started"])
        assert first["state"] == second["state"] == "done", (first, second)
        assert second["timings"]["started"] >= first["timings"]["finished"]
        for j in (first, second):
            assert jobdb.report(j["id"])["verify"]["ok"] is True
    finally:
        sched.stop()
        jobdb.close()


def _fmt(n):
    from spillway.options.sizes import format_bytes

    return format_bytes(n)
