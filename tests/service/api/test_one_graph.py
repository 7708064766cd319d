"""One graph a job, capacity asked: a service job's graph is built once, when it runs (the
submission is sized from its parameters), and the job queue reads the cluster's capacity
when it needs it, so workers that join after the queue started count."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from types import SimpleNamespace

import pytest

from spillway import workflows
from spillway.options.errors import AdmissionError
from spillway.launch import open_cluster
from spillway.memory.admission import Capacity
from spillway.options.settings import Options
from spillway.service.jobdb import JobDB
from spillway.run.target import target_of
from spillway.service.jobs.queue import JobQueue, _Running
from spillway.workflows import registry

PARAMS = {"size": "1200x1200", "chunks": "300x300"}


@pytest.fixture(scope="module")
def session():
    with open_cluster(Options.resolve(cpu=True, n_workers=1, dashboard_address="")) as s:
        yield s


def _count_builds(monkeypatch, name: str) -> list:
    """Replace workflow ``name`` in the catalogue by one whose build is counted."""
    workflows.names()  # the catalogue loaded before one entry is replaced
    spec = workflows.get(name)
    calls = []

    def build(params, target):
        calls.append(target)
        return spec.build(params, target)

    monkeypatch.setitem(registry._REGISTRY, name, dataclasses.replace(spec, build=build))
    return calls


def _wait(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


@pytest.mark.timeout(180)
def test_a_service_job_builds_its_graph_once(session, tmp_path, monkeypatch):
    builds = _count_builds(monkeypatch, "transpose-sum")
    jobdb = JobDB(f"sqlite:///{tmp_path / 'jobs.db'}")
    sched = JobQueue(jobdb, session, results_dir=str(tmp_path / "results"), poll_s=0.05)
    os.makedirs(sched.results_dir, exist_ok=True)
    try:
        # what the API does with a submission: the cluster's tiers, then the footprint
        footprint = sched.footprint("transpose-sum", PARAMS, tiers=sched.tiers())
        assert builds == [], "the submission built the job's graph"
        tenant, _ = jobdb.add_tenant("ann")
        job, _ = jobdb.submit(tenant, workflow="transpose-sum", params=PARAMS, verify=True, priority=0,
                              idempotency_key=None, footprint_bytes=footprint)
        sched.start()
        done = _wait(lambda: jobdb.job(job["id"])["state"] not in ("queued", "running"), 150)
        assert done, jobdb.job(job["id"])
        assert jobdb.job(job["id"])["state"] == "done", jobdb.job(job["id"])
        report = jobdb.report(job["id"])
        assert report["verify"]["ok"] is True
        # built once, at run time, on the workers' own chunk backend (not sized on NumPy metas)
        assert len(builds) == 1, builds
        assert builds[0].chunk_backend is None
        # the footprint the submission was queued with is the one the run's graph has
        assert report["footprint"]["total_bytes"] == footprint
    finally:
        sched.stop()
        jobdb.close()


def test_a_submission_past_the_cluster_is_refused_without_a_graph(session, tmp_path, monkeypatch):
    builds = _count_builds(monkeypatch, "stencil")
    jobdb = JobDB(f"sqlite:///{tmp_path / 'jobs.db'}")
    sched = JobQueue(jobdb, session)
    try:
        tiers = Capacity(device_bytes=0, host_bytes=2**20, disk_bytes=2**20, n_workers=1)
        # the input alone (7.63 MiB) is past the 2 MiB: refused by the parameters' bytes
        with pytest.raises(AdmissionError, match=r"projected footprint 7\.63 MiB exceeds .* capacity 2\.00 MiB"):
            sched.footprint("stencil", {"size": "1000x1000", "chunks": "250x250"}, tiers=tiers)
        # the input (1.53 MiB) fits; the projected footprint (input, output and halo chunks) does not
        with pytest.raises(AdmissionError, match=r"projected footprint 3\.\d\d MiB exceeds .* capacity 2\.00 MiB"):
            sched.footprint("stencil", {"size": "400x500", "chunks": "100x100"}, tiers=tiers)
        assert builds == []
    finally:
        jobdb.close()


@pytest.mark.timeout(120)
def test_the_queue_reads_the_workers_up_now(tmp_path, monkeypatch):
    """A worker that joins after the queue started counts: in the room jobs share, in the
    tiers a submission is admitted against and in the target it is sized for. The workers'
    limits are read again only when the workers changed (the loop asks 4 times a second)."""
    from spillway.service.jobs import queue as queue_module

    reads = []
    monkeypatch.setattr(queue_module, "target_of", lambda session: reads.append(1) or target_of(session))
    with open_cluster(Options.resolve(cpu=True, n_workers=1, dashboard_address="")) as s:
        jobdb = JobDB(f"sqlite:///{tmp_path / 'jobs.db'}")
        sched = JobQueue(jobdb, s)
        try:
            room, tiers = sched.worker_memory(), sched.tiers()
            assert sched.target().n_workers == tiers.n_workers == 1
            for _ in range(5):
                sched.worker_memory()
            assert len(reads) == 1, reads
            s.cluster.scale(2)
            s.client.wait_for_workers(2, timeout=60)
            assert _wait(lambda: sched.target().n_workers == 2, 30)
            assert sched.worker_memory() == 2 * room
            assert len(reads) == 2, reads
            grown = sched.tiers()
            assert grown.n_workers == 2
            assert grown.host_bytes == 2 * tiers.host_bytes
        finally:
            jobdb.close()


def test_the_queue_starts_a_job_once_the_room_it_asks_has_grown(tmp_path):
    """The room is asked on each pass, not kept: a job that waits for memory beside a
    running one starts on the first pass after the workers' memory grows."""
    jobdb = JobDB(f"sqlite:///{tmp_path / 'jobs.db'}")
    sched = JobQueue(jobdb, SimpleNamespace(n_workers=1, kind="cpu"))
    room = [900]
    asked = []

    def worker_memory():
        asked.append(room[0])
        return room[0]

    sched.worker_memory = worker_memory
    started = []
    sched._execute = started.append  # the job's run is not this test's: that it starts is
    try:
        ann, _ = jobdb.add_tenant("ann")
        ben, _ = jobdb.add_tenant("ben")
        first, _ = jobdb.submit(ann, workflow="transpose-sum", params=PARAMS, verify=False, priority=0,
                                idempotency_key=None, footprint_bytes=800)
        second, _ = jobdb.submit(ben, workflow="transpose-sum", params=PARAMS, verify=False, priority=0,
                                 idempotency_key=None, footprint_bytes=600)
        assert jobdb.start(first["id"], "started")
        sched._running[first["id"]] = _Running(thread=threading.Thread(target=lambda: None),
                                               job=jobdb.job(first["id"]))
        sched._tick()
        assert started == [] and asked == [900]
        reason = sched.waiting_reason(jobdb.job(second["id"]))
        assert reason.startswith("waiting for memory: 1 running job holds 800 B of the workers' 900 B; "
                                 "this job needs 600 B"), reason
        room[0] = 2000  # a worker joined
        sched._tick()
        _wait(lambda: started, 5)
        assert [j["id"] for j in started] == [second["id"]]
        assert jobdb.job(second["id"])["state"] == "running"
    finally:
        jobdb.close()
