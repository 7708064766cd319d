"""The job database goes away while jobs run: a real PostgreSQL on loopback, stopped for
15 s under a real `spillway serve` on CPU workers, then started again.

During the outage (15 s, or until a running job has ended and waits to record its end)
the API answers 503 with Retry-After and a JSON body on a connection that stays usable,
and /healthz names the database as down. A token revoked
just before the outage, used by the service just before that, cancels nothing: every
request whose token cannot be checked is a 503 (issue 45). After it, every job ends done
(with the right result); none stays running; the service was never restarted and never
answered 500.
"""

from __future__ import annotations

import json
import shutil
import socket
import time

import numpy as np
import pytest
from reference_inputs import uniform_numpy
from serve_helpers import (PostgresServer, Server, add_tenant, jobs_json, new_database, spillway, state_args,
                           temp_dir_others_reach, wait_for)


OUTAGE_S = 15
#: the most the outage is stretched, past OUTAGE_S, for a running job to end within it
LONGEST_OUTAGE_S = 300
RUNNING = {"size": "3000x3000", "chunks": "100x100"}  # a few seconds each, three at once
SMALL = {"size": "300x300", "chunks": "100x100"}


def expected_sum(n: int, seed: int) -> float:
    a = uniform_numpy((n, n), seed=seed, dtype="float64").astype(np.float64)
    return float((a + a.T).sum())


class KeepAlive:
    """One HTTP/1.1 connection, reused for every request (a reset shows as an error)."""

    def __init__(self, port: int, token: str):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.port, self.token = port, token

    def request(self, method: str, path: str) -> tuple[int, dict, dict, float]:
        start = time.perf_counter()
        self.sock.sendall((f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                           f"Authorization: Bearer {self.token}\r\nContent-Length: 0\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            assert chunk, f"the service closed the connection after {method} {path}"
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        while len(rest) < length:
            rest += self.sock.recv(65536)
        return int(lines[0].split()[1]), headers, json.loads(rest), time.perf_counter() - start

    def close(self):
        self.sock.close()


@pytest.mark.slow
@pytest.mark.timeout(600)  # a busy shared test machine runs the jobs slowly
def test_jobs_ride_out_a_postgresql_outage(tmp_path):
    # its own server (not the session's shared one), in a directory the postgres user
    # can reach when the tests run as root
    pg = PostgresServer(temp_dir_others_reach("spillway-pg-"))
    if not pg.available:
        pytest.skip("PostgreSQL server binaries not installed (.ci/setup.d/postgres.sh installs them)")
    pg.init()
    try:
        state = {"state_dir": str(tmp_path / "state"), "db": new_database(pg.url)}
        ann = add_tenant(state, "ann", "--max-running", "2")
        bob = add_tenant(state, "bob", "--max-running", "1")
        root = add_tenant(state, "root", "--admin")
        server = Server(state, "--cpu", "--n-workers", "2").start()
        try:
            _outage(server, pg, state, ann, bob, root)
        finally:
            server.stop()
    finally:
        pg.stop()
        shutil.rmtree(pg.root, ignore_errors=True)


def _submit(client, params, **body) -> str:
    r = client.post("/jobs", json={"workflow": "transpose-sum", "params": params, **body})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _outage(server: Server, pg: PostgresServer, state: dict, ann: str, bob: str, root: str):
    statuses = []
    with server.client(ann) as a, server.client(bob) as b, server.client(root) as admin:
        # different seeds: identical jobs would share their tasks on the cluster
        ann_running = [_submit(a, {**RUNNING, "seed": s}) for s in (1, 2)]
        ann_queued = [_submit(a, {**SMALL, "seed": s}) for s in (10, 11, 12, 13)]
        bob_running = _submit(b, {**RUNNING, "seed": 3})
        bob_queued = _submit(b, {**SMALL, "seed": 14})
        wait_for(lambda: all(admin.get(f"/jobs/{j}").json()["state"] == "running"
                             for j in ann_running + [bob_running]), 60, "three jobs to be running")
        pid = server.proc.pid
        # bob's token works, then is revoked (a new one issued) just before the outage
        assert b.get(f"/jobs/{bob_running}").status_code == 200
        out = spillway("tenant", "token", "bob", *state_args(state))
        assert out.returncode == 0, out.stderr

        pg.stop("fast")
        stopped = time.monotonic()
        conn_a, conn_b = KeepAlive(server.port, ann), KeepAlive(server.port, bob)
        health_times = []
        try:
            # the first request may be the one that finds the database gone
            wait_for(lambda: conn_a.request("GET", "/healthz")[0] == 503, 60, "/healthz to see the outage")
            status, headers, body, _ = conn_a.request("GET", "/jobs")
            statuses.append(status)
            assert status == 503 and int(headers["retry-after"]) >= 1, body
            assert body["detail"].startswith("the job database is unreachable since ")
            assert headers["content-type"] == "application/json"
            # the revoked token cannot be checked: its cancels are refused, running or queued
            for job_id in (bob_running, bob_queued):
                status, headers, body, _ = conn_b.request("POST", f"/jobs/{job_id}/cancel")
                statuses.append(status)
                assert status == 503 and int(headers["retry-after"]) >= 1, body
            # at least OUTAGE_S, and until a running job has ended and waits to record it (on a
            # loaded machine the jobs take longer than the outage would)
            def outage_over() -> bool:
                if time.monotonic() - stopped < OUTAGE_S:
                    return False
                assert time.monotonic() - stopped < LONGEST_OUTAGE_S, "no job ended during the outage"
                return "finish of job" in server.log.read_text()

            while not outage_over():
                for path in ("/healthz", "/jobs", f"/jobs/{ann_running[0]}", "/metrics", "/workflows"):
                    status, headers, body, took = conn_a.request("GET", path)
                    statuses.append(status)
                    assert status == 503 and "retry-after" in headers, (path, status, body)
                    if path == "/healthz":
                        health_times.append(took)
                        assert body["down"] == ["database"] and body["database"]["ok"] is False, body
                        assert body["database"]["error"] and body["queued"] is None
                r = a.post("/jobs", json={"workflow": "transpose-sum", "params": SMALL})
                statuses.append(r.status_code)
                assert r.status_code == 503 and r.headers["retry-after"], r.text
                time.sleep(0.5)
        finally:
            conn_a.close()
            conn_b.close()
        pg.start()

        wait_for(lambda: a.get("/healthz").status_code == 200, 30, "the service to see the database again")
        assert b.post(f"/jobs/{bob_running}/cancel").status_code == 401  # revoked, now that it can be told
        health = a.get("/healthz").json()
        assert health["status"] == "ok" and health["down"] == [] and health["database"]["ok"], health

        def settled():
            jobs = jobs_json(admin)
            return jobs if all(j["state"] in ("done", "failed", "cancelled") for j in jobs) else None

        try:
            jobs = {j["id"]: j for j in wait_for(settled, 300, "every job to end")}
        except AssertionError:
            for j in jobs_json(admin):
                print(j["id"], j["state"], j["error"], j["progress"], admin.get(f"/jobs/{j['id']}/logs").json()["lines"])
            print(server.log.read_text()[-6000:])
            raise
        assert len(jobs) == 8
        for job in jobs.values():
            assert job["state"] != "failed" or (job["error"] and "\n" not in job["error"]), job
        # the revoked token cancelled nothing
        for job_id, seed, n in ((bob_running, 3, 3000), (bob_queued, 14, 300)):
            assert jobs[job_id]["state"] == "done" and not jobs[job_id]["cancel_requested"], jobs[job_id]
            got = admin.get(f"/jobs/{job_id}/result").json()["summary"]["sum"]
            assert abs(got - expected_sum(n, seed)) / abs(expected_sum(n, seed)) < 1e-10
        for job_id, seed in zip(ann_running, (1, 2)):
            assert jobs[job_id]["state"] == "done", admin.get(f"/jobs/{job_id}/logs").json()
            got = admin.get(f"/jobs/{job_id}/result").json()["summary"]["sum"]
            assert abs(got - expected_sum(3000, seed)) / abs(expected_sum(3000, seed)) < 1e-10
        for job_id, seed in zip(ann_queued, (10, 11, 12, 13)):
            assert jobs[job_id]["state"] == "done", admin.get(f"/jobs/{job_id}/logs").json()
            got = admin.get(f"/jobs/{job_id}/result").json()["summary"]["sum"]
            assert abs(got - expected_sum(300, seed)) / abs(expected_sum(300, seed)) < 1e-10

    # the same process served throughout, and nothing was a 500
    assert server.proc.poll() is None and server.proc.pid == pid
    assert set(statuses) == {503}, {s: statuses.count(s) for s in set(statuses)}
    log = server.log.read_text()
    assert "Exception in ASGI application" not in log and "Traceback" not in log, log[-3000:]
    assert "job database unreachable" in log and "recorded after" in log, log[-3000:]
    health_times.sort()
    print(f"outage of {OUTAGE_S} s or more: {len(statuses)} requests answered 503, /healthz median "
          f"{health_times[len(health_times) // 2] * 1e3:.1f} ms, max {health_times[-1] * 1e3:.1f} ms")
