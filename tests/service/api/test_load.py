"""Load: 200 submissions from 10 tenants at once against a real server; no errors, each
tenant gets its own 20 jobs, each answered within the liveness deadline (serve_helpers.LIVENESS_S), and the latency
percentiles are reported (benchmarks/service/latency.py compares them with the target)."""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from serve_helpers import Server, add_tenant, jobs_json, record_figures

TENANTS = 10
PER_TENANT = 20


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    state = {"state_dir": str(tmp_path_factory.mktemp("load") / "state")}
    tokens = {f"lab{i}": add_tenant(state, f"lab{i}", "--max-running", "1") for i in range(TENANTS)}
    admin = add_tenant(state, "root", "--admin")
    server = Server(state, "--cpu", "--n-workers", "1").start()
    try:
        yield server, tokens, admin
    finally:
        server.stop()


@pytest.mark.slow
def test_200_submissions_from_10_tenants(service, tmp_path):
    server, tokens, admin = service
    clients = {name: server.client(token) for name, token in tokens.items()}

    def one(i):
        name = f"lab{i % TENANTS}"
        body = {"workflow": "transpose-sum", "params": {"size": "200x200", "chunks": "100x100", "seed": i},
                "priority": i % 3, "idempotency_key": f"load-{i}"}
        t0 = time.perf_counter()
        r = clients[name].post("/jobs", json=body)
        return name, r.status_code, r.json().get("id"), time.perf_counter() - t0

    n = TENANTS * PER_TENANT
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(one, range(n)))
    wall = time.perf_counter() - t0
    try:
        statuses = [status for _, status, _, _ in results]
        assert statuses == [201] * n, {s: statuses.count(s) for s in set(statuses)}
        latencies = sorted(lat for *_, lat in results)
        q = statistics.quantiles(latencies, n=100)
        figures = {"submissions": n, "tenants": TENANTS, "concurrency": 50, "wall_s": round(wall, 3),
                   "throughput_per_s": round(n / wall, 1), "p50_ms": round(1000 * q[49], 1),
                   "p99_ms": round(1000 * q[98], 1), "max_ms": round(1000 * latencies[-1], 1)}
        print("load:", json.dumps(figures))
        record_figures("200 submissions from 10 tenants", figures)
        (tmp_path / "load.json").write_text(json.dumps(figures))
        assert len({job_id for *_, job_id, _ in results}) == n
        for name, client in clients.items():
            mine = {job_id for who, _, job_id, _ in results if who == name}
            assert {j["id"] for j in jobs_json(client)} == mine
    finally:
        # the queue is not what this test measures: clear it
        with server.client(admin) as root:
            for job in jobs_json(root, state="queued"):
                root.post(f"/jobs/{job['id']}/cancel")
        for c in clients.values():
            c.close()
