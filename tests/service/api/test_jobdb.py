"""The job database on SQLite (WAL) and on a real PostgreSQL server, and the queue order."""

from __future__ import annotations

import threading
import time

import pytest
from serve_helpers import submit_job as submit

from spillway.service.jobs import next_job
from spillway.service.jobdb import JobDB, JobDBError, hash_token




def test_backend_is_the_one_asked_for(jobdb, db_state):
    assert jobdb.engine.dialect.name == db_state["backend"]
    if db_state["backend"] == "sqlite":
        with jobdb.engine.connect() as c:
            assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_tokens_are_stored_hashed_and_revocable(jobdb):
    info, token = jobdb.add_tenant("alice", max_running=3)
    assert token.startswith("spw_") and len(token) > 40
    with jobdb.engine.connect() as c:
        stored = c.exec_driver_sql("SELECT token_hash FROM tenants").scalar()
    assert stored == hash_token(token) and token not in stored
    assert jobdb.tenant_for_token(token)["name"] == "alice"
    assert jobdb.tenant_for_token(token + "x") is None
    with pytest.raises(JobDBError, match="already exists"):
        jobdb.add_tenant("alice")
    jobdb.revoke_tenant("alice")
    assert jobdb.tenant_for_token(token) is None
    with pytest.raises(JobDBError, match="no tenant 'bob'"):
        jobdb.revoke_tenant("bob")


def test_tenants_see_only_their_jobs(jobdb):
    alice, _ = jobdb.add_tenant("alice")
    bob, _ = jobdb.add_tenant("bob")
    admin, _ = jobdb.add_tenant("root", admin=True)
    job, created = submit(jobdb, alice)
    assert created and job["state"] == "queued" and job["tenant"] == "alice"
    assert jobdb.job(job["id"], alice)["id"] == job["id"]
    assert jobdb.job(job["id"], bob) is None
    assert jobdb.job(job["id"], admin)["id"] == job["id"]
    assert [j["id"] for j in jobdb.jobs(bob)] == []
    assert [j["id"] for j in jobdb.jobs(admin)] == [job["id"]]
    assert jobdb.request_cancel(job["id"], bob) is None
    assert jobdb.job(job["id"])["state"] == "queued"
    assert jobdb.request_cancel(job["id"], alice)["state"] == "cancelled"


def test_idempotency_key_returns_the_same_job_even_when_racing(jobdb):
    alice, _ = jobdb.add_tenant("alice")
    bob, _ = jobdb.add_tenant("bob")
    results = []

    def go():
        results.append(submit(jobdb, alice, key="k1"))

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({job["id"] for job, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    # keys are per tenant
    other, created = submit(jobdb, bob, key="k1")
    assert created and other["id"] != results[0][0]["id"]


def test_recover_requeues_running_jobs(jobdb):
    alice, _ = jobdb.add_tenant("alice")
    a, _ = submit(jobdb, alice)
    b, _ = submit(jobdb, alice)
    c, _ = submit(jobdb, alice)
    assert jobdb.start(a["id"], "started") and jobdb.start(b["id"], "started")
    assert not jobdb.start(a["id"], "started again")  # only a queued job starts
    jobdb.request_cancel(b["id"], alice)  # running: marked, still running
    assert jobdb.job(b["id"])["state"] == "running"
    assert sorted(jobdb.recover()) == sorted([a["id"], b["id"]])
    assert jobdb.job(a["id"])["state"] == "queued"
    assert jobdb.job(a["id"])["attempts"] == 1
    assert jobdb.job(b["id"])["state"] == "cancelled"
    assert jobdb.job(c["id"])["state"] == "queued"
    assert "queued to run again" in jobdb.logs(a["id"])[-1]["line"]
    assert jobdb.counts() == {"queued": 2, "running": 0, "done": 0, "failed": 0, "cancelled": 1}


def test_finish_keeps_report_and_spill(jobdb):
    alice, _ = jobdb.add_tenant("alice")
    a, _ = submit(jobdb, alice)
    jobdb.start(a["id"], "started")
    jobdb.finish(a["id"], "done", line="done", report={"result": {"sum": 1.5}}, wall_s=0.5,
                 bytes_spilled=123, tasks=7)
    job = jobdb.job(a["id"])
    assert job["state"] == "done" and job["bytes_spilled"] == 123
    assert job["progress"] == {"tasks_done": 7, "tasks_total": 7, "fraction": 1.0}
    assert jobdb.report(a["id"]) == {"result": {"sum": 1.5}}
    assert jobdb.spilled_total() == 123


def test_revoking_a_tenant_cancels_its_queued_jobs(jobdb):
    alice, _ = jobdb.add_tenant("alice")
    a, _ = submit(jobdb, alice)
    jobdb.revoke_tenant("alice")
    assert jobdb.job(a["id"])["state"] == "cancelled"


# --- the queue order (pure)

def row(job_id, tenant, *, priority=0, tenant_priority=0, created="2026-01-01T00:00:00", footprint=10,
        max_running=2):
    return {"id": job_id, "tenant_id": tenant, "priority": priority, "tenant_priority": tenant_priority,
            "tenant_max_running": max_running, "tenant_revoked": False, "cancel_requested": False,
            "footprint_bytes": footprint, "timings": {"created": created}}


def test_order_priority_then_fairness_then_age():
    queued = [row("a1", 1, created="1"), row("a2", 1, created="2"), row("b1", 2, created="3"),
              row("c1", 3, created="4", priority=5)]
    assert next_job(queued, [], 100)["id"] == "c1"
    queued = queued[:3]
    assert next_job(queued, [], 100)["id"] == "a1"
    # tenant 1 already runs one: tenant 2's job goes first though it is younger
    assert next_job(queued[1:], [row("a1", 1)], 100)["id"] == "b1"
    # tenant priority counts too
    assert next_job([row("a", 1), row("b", 2, tenant_priority=1)], [], 100)["id"] == "b"


def test_order_quota_and_footprint():
    # at its running quota, the tenant waits
    assert next_job([row("a2", 1, max_running=1)], [row("a1", 1)], 100) is None
    # does not fit beside what runs: waits; fits: starts
    assert next_job([row("b", 2, footprint=60)], [row("a", 1, footprint=50)], 100) is None
    assert next_job([row("b", 2, footprint=50)], [row("a", 1, footprint=50)], 100)["id"] == "b"
    # larger than the cluster: starts alone
    assert next_job([row("big", 2, footprint=500)], [], 100)["id"] == "big"
    # a small job does not overtake a waiting larger one
    queued = [row("big", 2, footprint=80, created="1"), row("small", 3, footprint=5, created="2")]
    assert next_job(queued, [row("a", 1, footprint=50)], 100) is None


def test_tokens_expire_rotate_and_record_their_use(jobdb):
    from datetime import datetime, timedelta, timezone

    _, first = jobdb.add_tenant("alice")
    info, second = jobdb.issue_token("alice", keep_old=True,
                                     expires=datetime.now(timezone.utc) + timedelta(seconds=1))
    # both valid during the rotation
    assert jobdb.authenticate(first)[0]["name"] == "alice"
    assert jobdb.authenticate(second)[0]["token_id"] == info["id"]
    jobdb.touch_token(info["id"])
    assert jobdb.tokens("alice")[1]["last_used"] is not None
    assert jobdb.tenants()[0]["last_used"] is not None and jobdb.tenants()[0]["tokens"] == 2
    # the end of the rotation: the old one goes
    assert jobdb.revoke_token("alice", old=True) == [1]
    assert jobdb.authenticate(first) == (None, "invalid or revoked token")
    time.sleep(1.1)
    tenant, why = jobdb.authenticate(second)
    assert tenant is None and why.startswith("token expired at ") and "spillway tenant token alice" in why
    assert "\n" not in why
    # without keep_old, a new token replaces every other at once
    _, third = jobdb.issue_token("alice")
    _, fourth = jobdb.issue_token("alice")
    assert jobdb.authenticate(third)[0] is None and jobdb.authenticate(fourth)[0]["name"] == "alice"
    with pytest.raises(JobDBError, match="token: alice has no valid token 99"):
        jobdb.revoke_token("alice", token_id=99)


def test_expiry_values_are_checked():
    from datetime import datetime, timezone

    from spillway.service.jobdb.tokens import parse_expiry

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert parse_expiry(expires_in="30d", now=now) == datetime(2026, 1, 31, tzinfo=timezone.utc)
    assert parse_expiry(expires_at="2027-01-31", now=now) == datetime(2027, 1, 31, tzinfo=timezone.utc)
    with pytest.raises(JobDBError, match=r"^expires-in: 'soon' is not a duration such as 30d"):
        parse_expiry(expires_in="soon", now=now)
    with pytest.raises(JobDBError, match=r"^expires-at: 2025-01-01T00:00:00\+00:00 is not in the future"):
        parse_expiry(expires_at="2025-01-01", now=now)


def test_a_database_of_the_first_schema_is_migrated(db_state):
    """A job database as the first release left it (tokens in the tenants table, no
    version row) opens with its tenants' tokens valid, once, on SQLite and PostgreSQL."""
    from sqlalchemy import text

    from spillway.service.jobdb.schema import SCHEMA_VERSION

    db = JobDB.open(db_state["state_dir"], db_state.get("db"))
    alice, token = db.add_tenant("alice")
    job, _ = submit(db, alice)
    with db.engine.begin() as c:  # back to the first schema
        c.execute(text("DROP TABLE tokens"))
        c.execute(text("DROP TABLE spillway_schema"))
    db.close()

    db = JobDB.open(db_state["state_dir"], db_state.get("db"))
    try:
        assert (db.schema_found, db.schema_version) == (1, SCHEMA_VERSION)
        assert db.authenticate(token)[0]["name"] == "alice"
        assert db.job(job["id"])["state"] == "queued"
        assert [t["expires"] for t in db.tokens("alice")] == [None]
    finally:
        db.close()
    db = JobDB.open(db_state["state_dir"], db_state.get("db"))
    try:
        assert db.schema_found == SCHEMA_VERSION and len(db.tokens("alice")) == 1
        with db.engine.begin() as c:
            c.execute(text("UPDATE spillway_schema SET version = 99"))
    finally:
        db.close()
    with pytest.raises(JobDBError, match="schema version 99 is newer than this spillway's"):
        JobDB.open(db_state["state_dir"], db_state.get("db"))


def test_release_requeues_then_fails_jobs_without_a_runner(jobdb):
    alice, _ = jobdb.add_tenant("alice")
    a, _ = submit(jobdb, alice)
    b, _ = submit(jobdb, alice)
    for attempt in (1, 2):
        assert jobdb.start(a["id"], "started")
        assert jobdb.release([a["id"]], "its runner ended", max_attempts=3) == [(a["id"], "queued")]
    assert jobdb.start(a["id"], "started")
    assert jobdb.release([a["id"]], "its runner ended", max_attempts=3) == [(a["id"], "failed")]
    job = jobdb.job(a["id"])
    assert job["state"] == "failed" and job["error"] == "its runner ended, 3 times; not run again"
    # a job that recorded its end meanwhile is left alone; a cancelled one ends cancelled
    assert jobdb.start(b["id"], "started")
    jobdb.request_cancel(b["id"], alice)
    assert jobdb.release([b["id"]], "its runner ended") == [(b["id"], "cancelled")]
    assert jobdb.release([a["id"], b["id"]], "its runner ended") == []
