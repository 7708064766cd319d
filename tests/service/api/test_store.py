"""The job store on SQLite (WAL) and on a real PostgreSQL server, and the queue order."""

from __future__ import annotations

import threading

import pytest

from spillway.service.jobs import next_job
from spillway.service.store import Store, StoreError, hash_token


@pytest.fixture
def store(db_state):
    s = Store.open(db_state["state_dir"], db_state.get("db"))
    yield s
    s.close()


def submit(store, tenant, key=None, **kw):
    args = dict(workflow="transpose-sum", params={"size": "40x40"}, verify=False, priority=0,
                idempotency_key=key, footprint_bytes=1000)
    args.update(kw)
    return store.submit(tenant, **args)


def test_backend_is_the_one_asked_for(store, db_state):
    assert store.engine.dialect.name == db_state["backend"]
    if db_state["backend"] == "sqlite":
        with store.engine.connect() as c:
            assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_tokens_are_stored_hashed_and_revocable(store):
    info, token = store.add_tenant("alice", max_running=3)
    assert token.startswith("spw_") and len(token) > 40
    with store.engine.connect() as c:
        stored = c.exec_driver_sql("SELECT token_hash FROM tenants").scalar()
    assert stored == hash_token(token) and token not in stored
    assert store.tenant_for_token(token)["name"] == "alice"
    assert store.tenant_for_token(token + "x") is None
    with pytest.raises(StoreError, match="already exists"):
        store.add_tenant("alice")
    store.revoke_tenant("alice")
    assert store.tenant_for_token(token) is None
    with pytest.raises(StoreError, match="no tenant 'bob'"):
        store.revoke_tenant("bob")


def test_tenants_see_only_their_jobs(store):
    alice, _ = store.add_tenant("alice")
    bob, _ = store.add_tenant("bob")
    admin, _ = store.add_tenant("root", admin=True)
    job, created = submit(store, alice)
    assert created and job["state"] == "queued" and job["tenant"] == "alice"
    assert store.job(job["id"], alice)["id"] == job["id"]
    assert store.job(job["id"], bob) is None
    assert store.job(job["id"], admin)["id"] == job["id"]
    assert [j["id"] for j in store.jobs(bob)] == []
    assert [j["id"] for j in store.jobs(admin)] == [job["id"]]
    assert store.request_cancel(job["id"], bob) is None
    assert store.job(job["id"])["state"] == "queued"
    assert store.request_cancel(job["id"], alice)["state"] == "cancelled"


def test_idempotency_key_returns_the_same_job_even_when_racing(store):
    alice, _ = store.add_tenant("alice")
    bob, _ = store.add_tenant("bob")
    results = []

    def go():
        results.append(submit(store, alice, key="k1"))

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({job["id"] for job, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    # keys are per tenant
    other, created = submit(store, bob, key="k1")
    assert created and other["id"] != results[0][0]["id"]


def test_recover_requeues_running_jobs(store):
    alice, _ = store.add_tenant("alice")
    a, _ = submit(store, alice)
    b, _ = submit(store, alice)
    c, _ = submit(store, alice)
    assert store.start(a["id"], "started") and store.start(b["id"], "started")
    assert not store.start(a["id"], "started again")  # only a queued job starts
    store.request_cancel(b["id"], alice)  # running: marked, still running
    assert store.job(b["id"])["state"] == "running"
    assert sorted(store.recover()) == sorted([a["id"], b["id"]])
    assert store.job(a["id"])["state"] == "queued"
    assert store.job(a["id"])["attempts"] == 1
    assert store.job(b["id"])["state"] == "cancelled"
    assert store.job(c["id"])["state"] == "queued"
    assert "queued to run again" in store.logs(a["id"])[-1]["line"]
    assert store.counts() == {"queued": 2, "running": 0, "done": 0, "failed": 0, "cancelled": 1}


def test_finish_keeps_report_and_spill(store):
    alice, _ = store.add_tenant("alice")
    a, _ = submit(store, alice)
    store.start(a["id"], "started")
    store.finish(a["id"], "done", line="done", report={"result": {"sum": 1.5}}, wall_s=0.5,
                 bytes_spilled=123, tasks=7)
    job = store.job(a["id"])
    assert job["state"] == "done" and job["bytes_spilled"] == 123
    assert job["progress"] == {"tasks_done": 7, "tasks_total": 7, "fraction": 1.0}
    assert store.report(a["id"]) == {"result": {"sum": 1.5}}
    assert store.spilled_total() == 123


def test_revoking_a_tenant_cancels_its_queued_jobs(store):
    alice, _ = store.add_tenant("alice")
    a, _ = submit(store, alice)
    store.revoke_tenant("alice")
    assert store.job(a["id"])["state"] == "cancelled"


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
