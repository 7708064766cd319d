"""The job runner against a job database that fails, on a real CPU cluster: the end of a
job is written again until the database answers (the result kept); a job left running
with no runner is requeued by the reconciler, then failed; a cancelled run that does not
stop is ended within the grace; a cancel taken while the database is down is applied
once it answers."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy.exc import OperationalError

import spillway.service.jobs.queue as scheduler_module
from spillway.service.jobdb import JobDB
from spillway.service.jobs.queue import JobQueue
from spillway.launch import open_cluster
from spillway.options.settings import Options

JOB = {"workflow": "slice", "params": {"size": [400, 400], "chunks": [100, 100], "step": 1}, "verify": True,
       "priority": 0, "idempotency_key": None, "footprint_bytes": 1, "output": False}


@pytest.fixture(scope="module")
def session():
    with open_cluster(Options.resolve(cpu=True, n_workers=1, dashboard_address="")) as s:
        yield s


@pytest.fixture
def jobdb(tmp_path):
    s = JobDB(f"sqlite:///{tmp_path / 'jobs.db'}")
    yield s
    s.close()


def _down() -> OperationalError:
    return OperationalError("SELECT 1", {}, ConnectionRefusedError("connection refused"))


def _final(jobdb: JobDB, job_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = jobdb.job(job_id)
        if job["state"] not in ("queued", "running"):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not end in {timeout} s: {jobdb.job(job_id)}; {jobdb.logs(job_id)}")


def test_the_end_of_a_job_is_written_again_until_the_database_answers(session, jobdb, monkeypatch):
    tenant, _ = jobdb.add_tenant("ann")
    job, _ = jobdb.submit(tenant, **JOB)
    real_finish = jobdb.finish
    refused = []

    def finish_while_down(*args, **kwargs):
        if len(refused) < 4:
            refused.append(time.monotonic())
            raise _down()
        return real_finish(*args, **kwargs)

    monkeypatch.setattr(jobdb, "finish", finish_while_down)
    sched = JobQueue(jobdb, session, poll_s=0.05, retry_max_s=0.5)
    sched.start()
    try:
        end = _final(jobdb, job["id"])
    finally:
        sched.stop()
    assert len(refused) == 4 and end["state"] == "done", (end, jobdb.logs(job["id"]))
    # the result computed before the outage is the one recorded
    assert jobdb.report(job["id"])["verify"]["ok"] is True
    # backoff: the waits between tries grow
    gaps = [b - a for a, b in zip(refused, refused[1:])]
    assert gaps[-1] > gaps[0] * 1.5, gaps


def test_a_job_without_a_runner_is_requeued_then_failed(session, jobdb):
    tenant, _ = jobdb.add_tenant("ann")
    job, _ = jobdb.submit(tenant, **JOB)
    sched = JobQueue(jobdb, session, max_attempts=2)  # not started: reconcile() by hand
    assert jobdb.start(job["id"], "started")  # as if its runner had died without a word
    assert sched.reconcile() == [(job["id"], "queued")]
    assert jobdb.logs(job["id"])[-1]["line"] == "its runner ended without recording an end: queued to run again"
    assert jobdb.start(job["id"], "started again")
    assert sched.reconcile() == [(job["id"], "failed")]
    end = jobdb.job(job["id"])
    assert end["error"] == "its runner ended without recording an end, 2 times; not run again"


def test_the_reconciler_runs_while_the_service_runs(session, jobdb, monkeypatch):
    """Not only start-up recovery: the running service finds a job left running by a
    runner that died, and requeues it."""
    tenant, _ = jobdb.add_tenant("ann")
    job, _ = jobdb.submit(tenant, **JOB)
    sched = JobQueue(jobdb, session, poll_s=0.05, reconcile_s=0.2)
    monkeypatch.setattr(sched, "_tick", lambda: None)  # start nothing: the job is the loop's orphan
    sched.start()
    try:
        assert jobdb.start(job["id"], "started by a runner that then died")
        deadline = time.monotonic() + 10
        while jobdb.job(job["id"])["state"] == "running" and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sched.stop()
    assert jobdb.job(job["id"])["state"] == "queued"
    assert jobdb.logs(job["id"])[-1]["line"] == "its runner ended without recording an end: queued to run again"


def test_a_cancelled_run_that_does_not_stop_is_ended_within_the_grace(session, jobdb, monkeypatch):
    tenant, _ = jobdb.add_tenant("ann")
    job, _ = jobdb.submit(tenant, **JOB)
    release = threading.Event()

    def stuck(*args, **kwargs):  # a run that ignores the cancel (say, a NumPy reference)
        release.wait(60)
        raise RuntimeError("released")

    monkeypatch.setattr(scheduler_module, "run_workflow", stuck)
    sched = JobQueue(jobdb, session, poll_s=0.05, reconcile_s=0.1, cancel_grace_s=1)
    sched.start()
    try:
        deadline = time.monotonic() + 30
        while jobdb.job(job["id"])["state"] != "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert jobdb.request_cancel(job["id"], tenant)["cancel_requested"] is True
        assert sched.request_cancel(job["id"], tenant)["cancel_requested"] is True
        end = _final(jobdb, job["id"], timeout=60)
        # given up on after its grace, while the run was still stuck (release is set below)
        assert end["state"] == "cancelled" and not release.is_set(), end
        assert jobdb.logs(job["id"])[-1]["line"].startswith("cancelled: the run did not stop within 1 s")
        with sched._lock:  # the scheduler holds no runner for it any more
            assert job["id"] not in sched._running
    finally:
        release.set()
        sched.stop()
    assert jobdb.job(job["id"])["state"] == "cancelled"  # the run's late end changes nothing


def test_a_cancel_taken_while_the_end_waits_for_the_database_wins(session, jobdb, monkeypatch):
    """The run finished during an outage and its done waits for the database; a cancel
    taken meanwhile in memory ends the job cancelled, its result discarded."""
    tenant, _ = jobdb.add_tenant("ann")
    job, _ = jobdb.submit(tenant, **JOB)
    real_finish = jobdb.finish
    down, tried = threading.Event(), threading.Event()
    down.set()

    def finish(job_id, state, **kwargs):
        if down.is_set() and state == "done":
            tried.set()
            raise _down()
        return real_finish(job_id, state, **kwargs)

    monkeypatch.setattr(jobdb, "finish", finish)
    sched = JobQueue(jobdb, session, poll_s=0.05, retry_max_s=0.2)
    sched.start()
    try:
        assert tried.wait(60)
        assert sched.request_cancel(job["id"], tenant)["cancel_requested"] is True
        time.sleep(0.5)
        down.clear()
        end = _final(jobdb, job["id"])
    finally:
        sched.stop()
    assert end["state"] == "cancelled" and end["cancel_requested"] is True, (end, jobdb.logs(job["id"]))
    assert jobdb.report(job["id"]) is None
    assert jobdb.logs(job["id"])[-1]["line"] == "cancelled: the run had finished; its result was discarded"
