"""A cancel accepted (answered with ``cancel_requested: true``) while a job's last tasks
finish ends the job cancelled and removes its output, never ``done``: the job runner on a
real CPU cluster and a real job database, with the cancel placed at the two points of the race
(after the run returned; after the runner's last look at the job database, before it records done)."""

from __future__ import annotations

import os
import time

import pytest

import spillway.service.jobs.queue as scheduler_module
from spillway.service.jobs.queue import JobQueue
from spillway.launch import open_cluster
from spillway.options.settings import Options
from spillway.service.jobdb import JobDB

JOB = {"workflow": "slice", "params": {"size": [400, 400], "chunks": [100, 100], "step": 1}, "verify": True,
       "priority": 0, "idempotency_key": None, "footprint_bytes": 1, "output": True}


@pytest.fixture(scope="module")
def session():
    with open_cluster(Options.resolve(cpu=True, n_workers=1, dashboard_address="")) as s:
        yield s


@pytest.fixture
def jobdb(tmp_path):
    s = JobDB(f"sqlite:///{tmp_path / 'jobs.db'}")
    yield s
    s.close()


def _final(jobdb: JobDB, job_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = jobdb.job(job_id)
        if job["state"] not in ("queued", "running"):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish in {timeout} s: {jobdb.job(job_id)}; {jobdb.logs(job_id)}")


def _run(jobdb: JobDB, session, tmp_path) -> tuple[dict, JobQueue]:
    tenant, _ = jobdb.add_tenant("ann")
    job, _ = jobdb.submit(tenant, **JOB)
    sched = JobQueue(jobdb, session, results_dir=str(tmp_path / "results"), poll_s=0.05)
    os.makedirs(sched.results_dir, exist_ok=True)
    return job, sched


def test_cancel_accepted_after_the_run_returned_ends_cancelled(session, jobdb, tmp_path, monkeypatch):
    job, sched = _run(jobdb, session, tmp_path)
    answers = []
    real_run = scheduler_module.run_workflow

    def run_then_cancel(*args, **kwargs):
        report = real_run(*args, **kwargs)
        # every task is done and the output written; the tenant's cancel arrives now
        assert os.path.isdir(report["output"])
        answers.append(jobdb.request_cancel(job["id"]))
        return report

    monkeypatch.setattr(scheduler_module, "run_workflow", run_then_cancel)
    sched.start()
    try:
        end = _final(jobdb, job["id"])
    finally:
        sched.stop()
    assert answers and answers[0]["state"] == "running" and answers[0]["cancel_requested"] is True
    assert end["state"] == "cancelled", (end, jobdb.logs(job["id"]))
    assert jobdb.report(job["id"]) is None
    assert not os.path.exists(sched.output_path(job["id"]))
    assert jobdb.logs(job["id"])[-1]["line"] == "cancelled: the run had finished; its result was discarded"


def test_cancel_accepted_just_before_done_is_recorded_ends_cancelled(session, jobdb, tmp_path, monkeypatch):
    job, sched = _run(jobdb, session, tmp_path)
    answers = []
    real_finish = jobdb.finish

    def cancel_then_finish(job_id, state, **kwargs):
        # the runner has looked at the job database for a cancel and found none; the tenant's
        # cancel lands between that look and the write of the job's end
        if state == "done" and not answers:
            answers.append(jobdb.request_cancel(job_id))
        return real_finish(job_id, state, **kwargs)

    monkeypatch.setattr(jobdb, "finish", cancel_then_finish)
    sched.start()
    try:
        end = _final(jobdb, job["id"])
    finally:
        sched.stop()
    assert answers and answers[0]["state"] == "running" and answers[0]["cancel_requested"] is True
    assert end["state"] == "cancelled", (end, jobdb.logs(job["id"]))
    assert not os.path.exists(sched.output_path(job["id"]))


def test_cancel_after_done_is_answered_as_done(session, jobdb, tmp_path):
    job, sched = _run(jobdb, session, tmp_path)
    sched.start()
    try:
        end = _final(jobdb, job["id"])
    finally:
        sched.stop()
    assert end["state"] == "done", (end, jobdb.logs(job["id"]))
    answer = jobdb.request_cancel(job["id"])
    assert answer["state"] == "done" and answer["cancel_requested"] is False
    assert os.path.isdir(sched.output_path(job["id"]))
