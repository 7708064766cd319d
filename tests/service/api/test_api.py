"""The HTTP API end to end: a real `spillway serve` on loopback with its own CPU cluster."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import Server, add_tenant, jobs_json, owner_client, wait_for, wait_state

from reference_inputs import uniform_numpy

SMALL = {"size": "400x400", "chunks": "100x100"}
#: long enough (several seconds on 2 cores) to be caught running
SLOW = {"size": "6000x6000", "chunks": "100x100"}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    state = {"state_dir": str(tmp_path_factory.mktemp("serve") / "state")}
    tokens = {
        "alice": add_tenant(state, "alice", "--max-running", "1", "--max-job-bytes", "300MB"),
        "bob": add_tenant(state, "bob", "--max-running", "2"),
        "root": add_tenant(state, "root", "--admin"),
    }
    server = Server(state, "--cpu", "--n-workers", "2").start()
    clients = {name: server.client(token) for name, token in tokens.items()}
    clients["anonymous"] = server.client()
    try:
        yield server, clients
    finally:
        for c in clients.values():
            c.close()
        server.stop()


def submit(client, params=SMALL, **body):
    r = client.post("/jobs", json={"workflow": "transpose-sum", "params": params, **body})
    assert r.status_code in (200, 201), r.text
    return r.json()


def reference_sum(n: int, seed: int = 0) -> float:
    a = uniform_numpy((n, n), seed=seed, dtype="float64").astype(np.float64)
    return float((a + a.T).sum())


def test_every_job_route_needs_a_token(service):
    _, c = service
    anon = c["anonymous"]
    for method, path in [("get", "/jobs"), ("get", "/jobs/x"), ("post", "/jobs/x/cancel"),
                         ("get", "/jobs/x/result"), ("get", "/jobs/x/logs"), ("get", "/workflows")]:
        r = getattr(anon, method)(path)
        assert r.status_code == 401, (path, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
    r = anon.post("/jobs", json={"workflow": "transpose-sum"})
    assert r.status_code == 401
    r = anon.get("/jobs", headers={"Authorization": "Bearer spw_not-a-token"})
    assert r.status_code == 401 and "invalid" in r.json()["detail"]
    # the service's reading to a tenant; to anyone else, whether it is up (issue 74)
    assert anon.get("/healthz").json() == {"status": "ok"}
    assert c["alice"].get("/healthz").json()["workers"] == 2


def test_job_runs_end_to_end_and_matches_numpy(service):
    _, c = service
    job = submit(c["alice"], verify=True)
    assert job["state"] == "queued" and job["tenant"] == "alice" and job["footprint_bytes"] > 0
    done = wait_state(c["alice"], job["id"], {"done", "failed"})
    assert done["state"] == "done", done
    assert done["progress"]["fraction"] == 1.0 and done["progress"]["tasks_total"] > 0
    assert done["timings"]["wall_s"] > 0 and done["timings"]["started"] and done["timings"]["finished"]
    assert done["bytes_spilled"] == 0 and done["attempts"] == 1
    result = c["alice"].get(f"/jobs/{job['id']}/result").json()
    expected = reference_sum(400)
    assert abs(result["summary"]["sum"] - expected) / abs(expected) < 1e-10
    assert result["report"]["verify"]["ok"] is True
    assert result["report"]["cluster"] == {"kind": "cpu", "n_workers": 2, "protocol": "tls"}  # the service's own TLS
    # the report of `spillway run`: peaks per worker (host RSS on CPU workers), moves per tier
    assert all(v > 10_000_000 for v in result["report"]["peak_host_bytes_per_worker"].values())
    assert set(result["report"]["spilled_by_tier"]) == {"device_to_host", "host_to_device", "host_to_disk",
                                                        "disk_to_host"}
    assert done["waiting"] is None
    lines = [entry["line"] for entry in c["alice"].get(f"/jobs/{job['id']}/logs").json()["lines"]]
    assert lines[0] == "queued by alice" and lines[1].startswith("started") and lines[-1].startswith("done")


def test_tenants_cannot_see_each_others_jobs(service):
    _, c = service
    job = submit(c["alice"])
    wait_state(c["alice"], job["id"], "done")
    for method, suffix in [("get", ""), ("post", "/cancel"), ("get", "/result"), ("get", "/logs")]:
        r = getattr(c["bob"], method)(f"/jobs/{job['id']}{suffix}")
        assert r.status_code == 404, (suffix, r.text)
    assert job["id"] not in {j["id"] for j in jobs_json(c["bob"])}
    assert job["id"] in {j["id"] for j in jobs_json(c["alice"])}
    assert c["root"].get(f"/jobs/{job['id']}").json()["tenant"] == "alice"
    assert {"alice"} == {j["tenant"] for j in jobs_json(c["alice"])}


def test_bytes_per_job_quota(service):
    _, c = service
    r = c["alice"].post("/jobs", json={"workflow": "transpose-sum", "params": {"size": "8000x8000"}})
    assert r.status_code == 422
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["body", "params"]
    assert "exceeds this tenant's limit of 286.10 MiB per job" in detail["msg"]
    # bob's limit is the default: the same job is accepted (and cancelled at once)
    job = submit(c["bob"], {"size": "8000x8000"}, priority=-10)
    c["bob"].post(f"/jobs/{job['id']}/cancel")


def test_bad_input_names_the_field(service):
    _, c = service
    cases = [
        ({"workflow": "no-such"}, ["body", "workflow"]),
        ({"workflow": "transpose-sum", "priority": 99}, ["body", "priority"]),
        ({"workflow": "transpose-sum", "params": {"size": "400x300"}}, ["body", "params", "size"]),
        ({"workflow": "transpose-sum", "params": {"sise": 4}}, ["body", "params", "sise"]),
        ({"workflow": "transpose-sum", "params": {"size": -4}}, ["body", "params", "size"]),
        ({"workflow": "transpose-sum", "extra": 1}, ["body", "extra"]),
    ]
    for body, loc in cases:
        r = c["bob"].post("/jobs", json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["detail"][0]["loc"] == loc, (body, r.json())
    assert c["bob"].get("/jobs", params={"limit": 0}).status_code == 422
    # a job id that is not one is refused before the database; one that names no job is 404
    r = c["bob"].get("/jobs/nope")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "job_id"], r.text
    assert c["bob"].get("/jobs/" + "f" * 32).status_code == 404


def test_idempotency_key_returns_the_same_job(service):
    _, c = service
    first = c["bob"].post("/jobs", json={"workflow": "transpose-sum", "params": SMALL, "idempotency_key": "run-7"})
    again = c["bob"].post("/jobs", json={"workflow": "transpose-sum", "params": SMALL, "idempotency_key": "run-7"})
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    by_header = c["bob"].post("/jobs", json={"workflow": "transpose-sum", "params": SMALL},
                              headers={"Idempotency-Key": "run-8"})
    again = c["bob"].post("/jobs", json={"workflow": "transpose-sum", "params": SMALL},
                          headers={"Idempotency-Key": "run-8"})
    assert by_header.json()["id"] == again.json()["id"] != first.json()["id"]
    # the same key with other values is a conflict, not a silent match
    clash = c["bob"].post("/jobs", json={"workflow": "transpose-sum", "params": {**SMALL, "seed": 9},
                                         "idempotency_key": "run-7"})
    assert clash.status_code == 409 and first.json()["id"] in clash.json()["detail"]
    # the same key from another tenant is another job
    other = c["alice"].post("/jobs", json={"workflow": "transpose-sum", "params": SMALL, "idempotency_key": "run-7"})
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    for job_id in {first.json()["id"], by_header.json()["id"]}:
        wait_state(c["bob"], job_id, "done")
    wait_state(c["alice"], other.json()["id"], "done")


def test_running_quota_priority_and_cancel(service):
    server, c = service
    alice = c["alice"]  # may run one job at a time
    slow = submit(alice, SLOW)
    wait_state(alice, slow["id"], "running", timeout=30)
    low = submit(alice, priority=-1)
    high = submit(alice, priority=5)
    # a result of an unfinished job is a 409
    assert alice.get(f"/jobs/{low['id']}/result").status_code == 409
    wait_for(lambda: alice.get(f"/jobs/{slow['id']}").json()["progress"]["tasks_done"] > 0, 30, "progress")
    assert alice.get(f"/jobs/{low['id']}").json()["state"] == "queued"
    assert alice.get(f"/jobs/{high['id']}").json()["state"] == "queued"

    r = alice.post(f"/jobs/{slow['id']}/cancel")
    assert r.status_code == 200 and r.json()["cancel_requested"]
    cancelled = wait_state(alice, slow["id"], {"cancelled", "done"}, timeout=30)
    assert cancelled["state"] == "cancelled", cancelled
    lows = wait_state(alice, low["id"], "done")
    highs = wait_state(alice, high["id"], "done")
    assert highs["timings"]["started"] < lows["timings"]["started"]

    # cancelling stopped the tasks and freed their memory: the scheduler holds none of
    # them (read through the owner's trusted scheduler file)
    owner_file = Path(server.state["state_dir"]) / "scheduler.json"
    assert oct(owner_file.stat().st_mode & 0o777) == "0o600"
    with owner_client(server.state["state_dir"]) as owner:
        # a lambda travels by value; a module function would need this test module there
        wait_for(lambda: owner.run_on_scheduler(lambda dask_scheduler=None: len(dask_scheduler.tasks)) == 0,
                 20, "the scheduler to drop the cancelled tasks")
    # a finished job cannot be cancelled
    assert alice.post(f"/jobs/{lows['id']}/cancel").json()["state"] == "done"


def test_catalogue_and_metrics(service):
    _, c = service
    catalogue = c["bob"].get("/workflows").json()
    names = {w["name"]: w for w in catalogue}
    assert "transpose-sum" in names
    assert set(names["transpose-sum"]["schema"]["properties"]) >= {"size", "chunks", "dtype", "seed"}
    assert c["anonymous"].get("/metrics").status_code == 401  # worker addresses, every tenant's counts
    assert c["bob"].get("/metrics").status_code == 403
    text = c["root"].get("/metrics").text
    metrics = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            metrics[name] = float(value)
    assert metrics["spillway_queue_depth"] >= 0
    assert metrics['spillway_jobs{state="done"}'] >= 1
    assert metrics["spillway_capacity_bytes"] > 0
    assert "spillway_job_spilled_bytes_total" in metrics
    assert sum(1 for k in metrics if k.startswith("spillway_worker_memory_bytes{")) == 2
    # bytes per tier: CPU workers without the tiered store hold host memory only
    assert metrics['spillway_tier_bytes{tier="host"}'] > 10_000_000
    assert metrics['spillway_tier_bytes{tier="device"}'] == metrics['spillway_tier_bytes{tier="disk"}'] == 0
    assert sum(1 for k in metrics if k.startswith("spillway_worker_tier_bytes{")) == 2


def test_openapi_spec_lists_the_api(service):
    _, c = service
    spec = c["anonymous"].get("/openapi.json").json()
    assert {"/jobs", "/jobs/{job_id}", "/jobs/{job_id}/cancel", "/jobs/{job_id}/result", "/jobs/{job_id}/logs",
            "/workflows", "/healthz", "/metrics"} <= set(spec["paths"])
    assert "transpose-sum" in json.dumps(spec["components"]["schemas"]["JobRequest"])


def test_zarr_output_and_inputs_only_from_data_dirs(service):
    server, c = service
    job = c["bob"].post("/jobs", json={"workflow": "rechunk", "params": {"size": "200x200", "chunks": "50x50"},
                                       "output": True}).json()
    assert job["output"] is True
    assert wait_state(c["bob"], job["id"], {"done", "failed"})["state"] == "done"
    result = c["bob"].get(f"/jobs/{job['id']}/result").json()
    results_dir = Path(server.state["state_dir"]) / "results"
    # in bob's own directory (0700), relative to the results directory; the directory itself
    # is told to a client on the service's machine alone (this one: loopback), and nowhere
    # else in the result (tests/service/test_client.py asks as from another machine)
    assert result["output"] == f"bob/{job['id']}.zarr" and result["report"]["output"] == result["output"]
    assert result["results_dir"] == str(results_dir.resolve())
    assert str(results_dir) not in str({k: v for k, v in result.items() if k != "results_dir"})
    import zarr

    stored = np.asarray(zarr.open_array(results_dir / result["output"], mode="r")[...], dtype=np.float64)
    expected = uniform_numpy((200, 200), seed=0, dtype="float64").astype(np.float64)
    assert np.linalg.norm(stored - expected) / np.linalg.norm(expected) < 1e-12

    # a summary-only workflow has nothing to write
    r = c["bob"].post("/jobs", json={"workflow": "transpose-sum", "params": SMALL, "output": True})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "output"]
    # no tenant reads files outside the data directories, another tenant's results included
    for path in ["/etc", str(results_dir / result["output"])]:
        r = c["alice"].post("/jobs", json={"workflow": "elementwise", "params": {"input": path}})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"][0]
        assert detail["loc"] == ["body", "params", "input"]
        assert "outside this tenant's data directories" in detail["msg"]
