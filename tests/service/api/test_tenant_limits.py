"""A tenant added without a limit may submit jobs up to the serving cluster's memory
(device + host tier; issue 45: not its spill disk too), and up to what the cluster admits
once its owner says `cluster`; an owner's own limit still refuses with its number; `tenant
add|list|set` print sizes as people read them; a database made with the old 64 GiB default
keeps its stored limits."""

from __future__ import annotations

import json
import re
import sqlite3
import time

import pytest
from serve_helpers import Server, add_tenant, spillway, state_args, wait_state

import spillway as sw
from spillway.service.client import ServiceError
from spillway.service.jobdb import CLUSTER_JOB_BYTES, DEFAULT_MAX_JOB_BYTES, DEFAULT_MAX_QUEUED, JobDB
from spillway.service.jobdb.schema import OLD_DEFAULT_MAX_JOB_BYTES, SCHEMA_VERSION, old_default_tenants

SLOW = {"size": "3000x3000", "chunks": "60x60"}


def test_the_defaults_are_the_clusters_memory_and_100_queued(db_state):
    assert DEFAULT_MAX_JOB_BYTES is None and DEFAULT_MAX_QUEUED == 100
    jobdb = JobDB.open(db_state["state_dir"], db_state.get("db"))
    try:
        info, _ = jobdb.add_tenant("ann")
        assert info["max_job_bytes"] is None and info["max_queued"] == 100 and info["max_running"] == 2
        assert jobdb.set_tenant("ann", max_job_bytes=2**30)["max_job_bytes"] == 2**30
        assert jobdb.set_tenant("ann", max_job_bytes=CLUSTER_JOB_BYTES)["max_job_bytes"] == CLUSTER_JOB_BYTES
        assert jobdb.set_tenant("ann", max_job_bytes=None)["max_job_bytes"] is None
        assert jobdb.set_tenant("ann", max_queued=5)["max_queued"] == 5
        with pytest.raises(Exception, match=r"max-job-bytes: 0 must be >= 1 \(or unset: the cluster's memory; "
                                            r"-1: its admission, spill disk included\)"):
            jobdb.set_tenant("ann", max_job_bytes=0)
        with pytest.raises(Exception, match=r"max-queued: 0 must be >= 1 \(or unset: 100\)"):
            jobdb.set_tenant("ann", max_queued=0)
        with pytest.raises(Exception, match="name: no tenant 'bob'"):
            jobdb.set_tenant("bob", priority=1)
    finally:
        jobdb.close()


def test_tenant_cli_prints_quotas_sizes_and_words(tmp_path):
    state = {"state_dir": str(tmp_path)}
    out = spillway("tenant", "add", "ann", *state_args(state))
    assert out.returncode == 0, out.stderr
    assert "max-running=2, max-queued=100, max-job-bytes=memory)" in out.stdout
    out = spillway("tenant", "add", "bob", "--max-job-bytes", "200GB", "--max-queued", "500", *state_args(state))
    assert "max-queued=500, max-job-bytes=186.26 GiB)" in out.stdout
    listed = spillway("tenant", "list", *state_args(state)).stdout.splitlines()
    assert re.match(r"name\s+admin\s+priority\s+running\s+queued\s+job bytes\s+state", listed[0]), listed
    assert re.match(r"ann\s+false\s+0\s+2\s+100\s+memory\s+active\s+1\s+never\s+-$", listed[1]), listed
    assert re.match(r"bob\s+false\s+0\s+2\s+500\s+186\.26 GiB\s+active\s+1\s+never\s+-$", listed[2]), listed
    assert "68719476736" not in "\n".join(listed)
    rows = json.loads(spillway("tenant", "list", "--json", *state_args(state)).stdout)
    assert [(r["max_job_bytes"], r["max_queued"]) for r in rows] == [("memory", 100), (200_000_000_000, 500)]
    # an owner sets a lower limit, allows the spill disk, and goes back to the default
    out = spillway("tenant", "set", "ann", "--max-job-bytes", "100GB", *state_args(state))
    assert out.returncode == 0 and "max-job-bytes=93.13 GiB" in out.stdout, out.stderr
    out = spillway("tenant", "update", "ann", "--max-job-bytes", "cluster", "--max-queued", "7",
                   "--max-running", "3", *state_args(state))
    assert "max-running=3, max-queued=7, max-job-bytes=cluster" in out.stdout, out.stderr
    assert json.loads(spillway("tenant", "list", "--json", *state_args(state)).stdout)[0]["max_job_bytes"] == "cluster"
    out = spillway("tenant", "set", "ann", "--max-job-bytes", "memory", *state_args(state))
    assert "max-job-bytes=memory" in out.stdout
    bad = spillway("tenant", "set", "ann", "--max-job-bytes", "lots", *state_args(state))
    assert bad.returncode == 2 and "'lots'" in bad.stderr and "'memory'" in bad.stderr and "'cluster'" in bad.stderr
    bad = spillway("tenant", "set", "ann", "--max-queued", "0", *state_args(state))
    assert bad.returncode == 2 and "--max-queued" in bad.stderr
    none = spillway("tenant", "set", "ann", *state_args(state))
    assert none.returncode == 2 and "give --priority, --max-running, --max-queued, --max-job-bytes, --data or --default-data" in none.stderr


def _old_database(path, version: int) -> None:
    """The tenants table as spillway made it before: max_job_bytes NOT NULL, 64 GiB given;
    schema ``version`` 1 (no tokens table, no version row) or 2 (tokens, version row 2)."""
    jobdb = JobDB(f"sqlite:///{path}")
    jobdb.close()
    con = sqlite3.connect(path)
    sql = con.execute("SELECT sql FROM sqlite_master WHERE name = 'tenants'").fetchone()[0]
    con.executescript("PRAGMA foreign_keys=OFF; DROP TABLE tenants; "
                      + sql.replace("max_job_bytes BIGINT,", "max_job_bytes BIGINT NOT NULL,") + ";"
                      "CREATE UNIQUE INDEX ix_tenants_token_hash ON tenants (token_hash);")
    if version == 1:
        con.executescript("DROP TABLE tokens; DROP TABLE spillway_schema;")
    else:
        con.execute("UPDATE spillway_schema SET version = ?", (version,))
    con.execute("INSERT INTO tenants (id, name, token_hash, admin, priority, max_running, max_job_bytes, revoked,"
                " created) VALUES (1, 'old', 'h1', 0, 0, 2, ?, 0, '2026-01-01 00:00:00'),"
                " (2, 'own', 'h2', 0, 0, 2, 1000, 0, '2026-01-01 00:00:00')", (OLD_DEFAULT_MAX_JOB_BYTES,))
    if version >= 2:
        con.execute("INSERT INTO tokens (tenant_id, token_hash, created) VALUES (1, 'h1', '2026-01-01 00:00:00'),"
                    " (2, 'h2', '2026-01-01 00:00:00')")
    con.execute("INSERT INTO jobs (id, tenant_id, workflow, params, verify, output, priority, state, "
                "cancel_requested, footprint_bytes, attempts, tasks_total, tasks_done, bytes_spilled, created) "
                "VALUES ('j1', 1, 'slice', '{}', 0, 0, 0, 'done', 0, 1, 1, 1, 1, 0, '2026-01-01 00:00:00')")
    con.commit()
    with pytest.raises(sqlite3.IntegrityError):
        con.execute("INSERT INTO tenants (name, token_hash, admin, priority, max_running, max_job_bytes, revoked, "
                    "created) VALUES ('x', 'h3', 0, 0, 2, NULL, 0, '2026-01-01')")
    con.close()


@pytest.mark.parametrize("version", [1, 2])
def test_an_old_database_keeps_its_limits_and_takes_the_new_default(tmp_path, version, capsys):
    from spillway.cli.serve import _notice_old_limits

    path = tmp_path / "spillway.db"
    _old_database(path, version)
    jobdb = JobDB(f"sqlite:///{path}")
    try:
        assert (jobdb.schema_found, jobdb.schema_version) == (version, SCHEMA_VERSION)
        by_name = {t["name"]: t for t in jobdb.tenants()}
        assert by_name["old"]["max_job_bytes"] == OLD_DEFAULT_MAX_JOB_BYTES
        assert by_name["own"]["max_job_bytes"] == 1000
        assert [by_name[n]["tokens"] for n in ("old", "own")] == [1, 1]  # their tokens kept (or copied, from 1)
        assert old_default_tenants(jobdb.tenants()) == ["old"]
        _notice_old_limits(jobdb)  # what `spillway serve` says on start
        assert "tenant(s) old keep the old default limit of 64 GiB per job" in capsys.readouterr().err
        info, _ = jobdb.add_tenant("new")
        assert info["max_job_bytes"] is None
        assert jobdb.job("j1")["tenant"] == "old"  # the jobs still name their tenant
    finally:
        jobdb.close()
    # opened again: nothing left to migrate, nothing changed
    jobdb = JobDB(f"sqlite:///{path}")
    assert jobdb.schema_found == SCHEMA_VERSION
    assert [t["max_job_bytes"] for t in jobdb.tenants()] == [OLD_DEFAULT_MAX_JOB_BYTES, 1000, None]
    jobdb.close()
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA foreign_key_check").fetchall() == []
    assert "ix_tenants_token_hash" in {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert con.execute("SELECT version FROM spillway_schema").fetchall() == [(SCHEMA_VERSION,)]
    con.close()


def test_a_database_that_lifted_the_limit_before_schema_versions(tmp_path):
    """A database made while the nullable column came from the unversioned migration (no
    version row, no tokens table, max_job_bytes already nullable) passes step 3 unchanged."""
    path = tmp_path / "spillway.db"
    jobdb = JobDB(f"sqlite:///{path}")
    jobdb.add_tenant("ann")
    jobdb.add_tenant("bob", max_job_bytes=1000)
    jobdb.close()
    con = sqlite3.connect(path)
    con.executescript("DROP TABLE tokens; DROP TABLE spillway_schema;")
    con.close()
    jobdb = JobDB(f"sqlite:///{path}")
    try:
        assert (jobdb.schema_found, jobdb.schema_version) == (1, SCHEMA_VERSION)
        assert [(t["max_job_bytes"], t["tokens"]) for t in jobdb.tenants()] == [(None, 1), (1000, 1)]
    finally:
        jobdb.close()


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    state = {"state_dir": str(tmp_path_factory.mktemp("serve") / "state")}
    tokens = {"dora": add_tenant(state, "dora"), "cara": add_tenant(state, "cara", "--max-job-bytes", "cluster"),
              "owen": add_tenant(state, "owen", "--max-job-bytes", "500MB", "--max-running", "1")}
    server = Server(state, "--cpu", "--n-workers", "1", "--memory-limit", "1GB").start()
    try:
        yield server, tokens
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_default_tenant_submits_up_to_the_clusters_memory(service):
    server, tokens = service
    dora = sw.connect(server.url, tokens["dora"])
    # within the worker's 1 GB host tier: accepted for a tenant without a limit
    job = dora.submit("transpose-sum", size="8000x8000", chunks="2000x2000", priority=-10)
    job.cancel()
    # past the workers' 1 GB but within host + disk: the default refuses it, naming the memory
    with pytest.raises(ServiceError) as refused:
        dora.submit("transpose-sum", size="12000x12000", chunks="2000x2000", priority=-10)
    assert re.search(r"projected footprint 1\.13 GiB exceeds this tenant's limit of 0\.93 GiB per job, the "
                     r"cluster's memory \(device \+ host tier: the default; with its spill disk the cluster admits "
                     r"[\d.]+ \w+ where the owner allows it\)", str(refused.value)), refused.value
    # a tenant its owner set to `cluster` may use the disk too
    cara = sw.connect(server.url, tokens["cara"])
    job = cara.submit("transpose-sum", size="12000x12000", chunks="2000x2000", priority=-10)
    assert job.record["footprint_bytes"] > 10**9
    job.cancel()
    # past the cluster: refused with the cluster's numbers
    with pytest.raises(ServiceError) as refused:
        cara.submit("transpose-sum", size="1PB")
    assert re.search(r"projected footprint 909\.49 TiB exceeds the cluster's device \+ host \+ disk capacity "
                     r"[\d.]+ \w+ \(device 0 B \+ host tier 0\.93 GiB \+ disk [\d.]+ \w+ "
                     r"\([\d.]+ \w+ free less a reserve of [\d.]+ \w+\), 1 worker\)", str(refused.value)), refused.value
    # an owner's own limit refuses with its number, and the cluster's
    owen = sw.connect(server.url, tokens["owen"])
    with pytest.raises(ServiceError, match=r"exceeds this tenant's limit of 476\.84 MiB per job "
                                           r"\(the cluster admits [\d.]+ \w+\)"):
        owen.submit("transpose-sum", size="9000x9000")
    for c in (dora, cara, owen):
        c.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_queued_job_says_why_it_waits(service):
    server, tokens = service
    owen = sw.connect(server.url, tokens["owen"])
    first = owen.submit("transpose-sum", SLOW)
    second = owen.submit("transpose-sum", size="400x400", chunks="100x100")
    wait_state(server.client(tokens["owen"]), first.id, "running")
    # the queue says why once its loop has looked at the job since the first one started;
    # on a loaded machine the status can come before that pass (a minute is liveness)
    deadline = time.monotonic() + 60
    status = second.status()
    while status["waiting"] == "queued: the job queue looks at it on its next pass" and time.monotonic() < deadline:
        time.sleep(0.1)
        status = second.status()
    assert status["state"] == "queued"
    assert status["waiting"] == "waiting for its tenant's running jobs: 1 of at most 1 running"
    assert second.waiting == status["waiting"] and "waiting for its tenant" in repr(second)
    assert first.status()["waiting"] is None
    assert first.result(timeout=120).summary and second.result(timeout=120).summary
    assert second.status()["waiting"] is None
    owen.close()


def test_an_old_postgresql_database_is_migrated(db_state):
    if db_state["backend"] != "postgresql":
        pytest.skip("SQLite's rebuild is tested above")
    jobdb = JobDB.open(db_state["state_dir"], db_state["db"])
    jobdb.add_tenant("old", max_job_bytes=OLD_DEFAULT_MAX_JOB_BYTES)
    with jobdb.engine.begin() as conn:  # the column as spillway's schema version 2 made it
        conn.exec_driver_sql("ALTER TABLE tenants ALTER COLUMN max_job_bytes SET NOT NULL")
        conn.exec_driver_sql("UPDATE spillway_schema SET version = 2")
    jobdb.close()
    jobdb = JobDB.open(db_state["state_dir"], db_state["db"])
    try:
        assert (jobdb.schema_found, jobdb.schema_version) == (2, SCHEMA_VERSION)
        assert jobdb.add_tenant("new")[0]["max_job_bytes"] is None
        assert [t["max_job_bytes"] for t in jobdb.tenants()] == [OLD_DEFAULT_MAX_JOB_BYTES, None]
    finally:
        jobdb.close()


def test_schema_4_adds_the_queue_quota_and_names_the_tenants_whose_default_changed(db_state, caplog):
    """A database at schema 3 (no max_queued column, no index of jobs by state and tenant):
    opened, it gains both through the step's add_column and add_index; every tenant has
    the default queue quota; the tenants whose unset per-job limit meant the cluster's disk
    too are logged by name."""
    jobdb = JobDB.open(db_state["state_dir"], db_state.get("db"))
    jobdb.add_tenant("ann")
    jobdb.add_tenant("bob", max_job_bytes=1000)
    with jobdb.engine.begin() as conn:  # as schema 3 made it
        conn.exec_driver_sql("DROP INDEX ix_jobs_state_tenant")
        conn.exec_driver_sql("ALTER TABLE tenants DROP COLUMN max_queued")
        conn.exec_driver_sql("UPDATE spillway_schema SET version = 3")
    jobdb.close()
    with caplog.at_level("WARNING", logger="spillway.jobdb"):
        jobdb = JobDB.open(db_state["state_dir"], db_state.get("db"))
    try:
        assert (jobdb.schema_found, jobdb.schema_version) == (3, SCHEMA_VERSION) and SCHEMA_VERSION == 5
        assert [(t["name"], t["max_queued"], t["max_job_bytes"]) for t in jobdb.tenants()] == [
            ("ann", 100, None), ("bob", 100, 1000)]
        from sqlalchemy import inspect

        assert "ix_jobs_state_tenant" in {i["name"] for i in inspect(jobdb.engine).get_indexes("jobs")}
        assert jobdb.set_tenant("ann", max_queued=3)["max_queued"] == 3
    finally:
        jobdb.close()
    assert ("tenant(s) ann without a per-job limit may now submit jobs up to the cluster's memory (device + host "
            "tier), no longer its spill disk too") in caplog.text
