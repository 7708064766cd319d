"""`spillway.connect`: the notebook client against a real `spillway serve` on loopback
with its own CPU cluster."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import dask
import numpy as np
import pytest

pytest.importorskip("httpx")

from reference_inputs import uniform_numpy  # noqa: E402
import spillway  # noqa: E402
from spillway.service.client import JobFailed, JobResult, ServiceError, open_output  # noqa: E402
from spillway.run.report import Report  # noqa: E402

# the service tests' helpers start `spillway serve` on loopback and add tenants
sys.path.insert(0, str(Path(__file__).parent / "api"))
from serve_helpers import Server, add_tenant, free_port, wait_for  # noqa: E402

SMALL = {"size": "600x600", "chunks": "100x100"}
#: several seconds on 2 cores: long enough to be seen running
SLOW = {"size": "6000x6000", "chunks": "100x100"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("client")
    state = {"state_dir": str(root / "state"), "data_dir": str(root / "data")}
    Path(state["data_dir"]).mkdir()
    tokens = {"alice": add_tenant(state, "alice", "--max-job-bytes", "300MB"), "bob": add_tenant(state, "bob")}
    # loopback is a trusted proxy: a request may be asked as from another machine
    server = Server(state, "--cpu", "--n-workers", "2", "--data-dir", state["data_dir"],
                    "--trusted-proxy", "127.0.0.1").start()
    try:
        yield server, tokens, state
    finally:
        server.stop()


@pytest.fixture(scope="module")
def alice(served):
    server, tokens, state = served
    # where this machine sees the service's results directory (the default, STATE_DIR/results)
    with spillway.connect(server.url, tokens["alice"], results_dir=str(Path(state["state_dir"]) / "results")) \
            as client:
        yield client


def rel_error(computed, expected) -> float:
    return float(np.linalg.norm(np.asarray(computed, np.float64) - expected) / np.linalg.norm(expected))


def test_connect_refuses_a_bad_token_with_the_service_message(served):
    server, _, _ = served
    with pytest.raises(ServiceError, match="invalid or revoked token") as e:
        spillway.connect(server.url, "spw_not-a-token")
    assert e.value.status == 401
    with pytest.raises(ServiceError, match="token: a tenant token is required"):
        spillway.connect(server.url, "")


def test_connect_to_nothing_names_the_address():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServiceError, match=f"cannot reach the service at {url}"):
        spillway.connect(url, "spw_x", timeout=5)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_connect_over_https_with_the_service_certificate(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    state = {"state_dir": str(tmp_path / "state")}
    token = add_tenant(state, "carol")
    server = Server(state, "--cpu", "--n-workers", "1", https=(str(cert), str(key))).start()
    try:
        with pytest.raises(ServiceError, match="cannot reach the service at https://.*CERTIFICATE_VERIFY_FAILED"):
            spillway.connect(server.url, token)
        with spillway.connect(server.url, token, verify=str(cert)) as svc:
            result = svc.submit("transpose-sum", size="200x200", chunks="100x100", verify=True).result(timeout=60)
            assert result.report["verify"]["ok"] is True
    finally:
        server.stop()


def test_catalogue_and_health(alice):
    from spillway import workflows
    catalogue = alice.workflows()
    assert [w["name"] for w in catalogue] == workflows.names()
    assert all(w["schema"]["properties"] for w in catalogue)
    assert alice.health()["kind"] == "cpu" and alice.health()["workers"] == 2


def test_submit_wait_and_result_match_numpy(alice):
    job = alice.submit("transpose-sum", SMALL, verify=True, seed=4)
    assert job.state == "queued" and job.record["params"]["seed"] == 4
    stream = io.StringIO()
    assert job.wait(timeout=60, progress=stream) is job
    bar = stream.getvalue()
    assert "transpose-sum" in bar and "100%" in bar and "done" in bar, bar
    assert job.status()["progress"]["fraction"] == 1.0

    result = job.result()
    a = uniform_numpy((600, 600), seed=4, dtype="float64")
    expected = float((a + a.T).sum())
    assert abs(result.summary["sum"] - expected) / abs(expected) < 1e-10
    assert isinstance(result.report, Report) and result.report["verify"]["ok"] is True
    assert result.array is None and result.output is None
    assert "verify        OK" in str(result.report)
    assert "spillway run: transpose-sum" in result._repr_html_()

    lines = job.logs()
    assert lines[0].endswith("queued by alice") and lines[-1].split("  ", 1)[1].startswith("done in")
    assert job.id in {j.id for j in alice.jobs()}
    html = job._repr_html_()
    assert job.id in html and ">done<" in html and "600x600" in html


def test_array_result_is_a_lazy_dask_array_over_the_zarr_output(alice, tmp_path):
    job = alice.submit("slice", {"size": "900x300", "chunks": "100x100", "step": 4}, output=True)
    result = job.result(timeout=60)
    # named relative to the results directory, never by the server's own path
    assert result.output == f"alice/{job.id}.zarr" and result.report["output"] == result.output
    rows = result.array
    assert dask.is_dask_collection(rows) and rows.shape == (225, 300)
    assert type(rows._meta).__module__ == "numpy"  # no GPU on this machine
    expected = uniform_numpy((900, 300), seed=0, dtype="float64")[::4]
    assert rel_error(rows.compute(scheduler="threads"), expected) <= 1e-12

    # the results directory seen elsewhere (a mount): paths are mapped by job
    mount = tmp_path / "mounted-results"
    mount.symlink_to(Path(result.path).parent.parent)
    moved = JobResult({"id": job.id, "state": "done", "summary": result.summary, "output": result.output,
                       "report": dict(result.report)}, results_dir=str(mount))
    assert moved.path == str(mount / "alice" / f"{job.id}.zarr")
    assert rel_error(moved.array.compute(scheduler="threads"), expected) <= 1e-12
    nowhere = JobResult({"id": job.id, "state": "done", "summary": {}, "report": {}, "output": result.output},
                        results_dir=str(tmp_path / "not-mounted"))
    with pytest.raises(ServiceError, match="no Zarr store at .*not-mounted.*results_dir="):
        nowhere.array  # noqa: B018 (reading the property opens the store)
    unknown = JobResult({"id": job.id, "state": "done", "summary": {}, "report": {}, "output": result.output})
    with pytest.raises(ServiceError, match=r"relative to its results directory .*pass results_dir= to "
                                           r"spillway.connect \(or set SPILLWAY_RESULTS_DIR\)"):
        unknown.array  # noqa: B018


def test_an_array_result_opens_on_the_services_machine_with_no_results_dir(served, monkeypatch):
    """issue 75: the README's example passes no results_dir; on the service's own machine
    the service says where its results are, and a client elsewhere is told what to pass."""
    server, tokens, state = served
    monkeypatch.delenv("SPILLWAY_RESULTS_DIR", raising=False)
    results = (Path(state["state_dir"]) / "results").resolve()
    with spillway.connect(server.url, tokens["bob"]) as bob:
        assert bob.results_dir is None
        job = bob.submit("slice", {"size": "900x300", "chunks": "100x100", "step": 4}, output=True)
        result = job.result(timeout=60)
        assert result.output == f"bob/{job.id}.zarr" and result.path == str(results / "bob" / f"{job.id}.zarr")
        expected = uniform_numpy((900, 300), seed=0, dtype="float64")[::4]
        assert rel_error(result.array.compute(scheduler="threads"), expected) <= 1e-12
        # asked as from another machine (through the proxy the service trusts): no server path
        elsewhere = bob.request("GET", f"/jobs/{job.id}/result", headers={"X-Forwarded-For": "10.0.0.7"})
        assert elsewhere["results_dir"] is None and str(results) not in json.dumps(elsewhere)
        with pytest.raises(ServiceError) as told:
            JobResult(elsewhere).array  # noqa: B018 (reading the property opens the store)
        assert str(told.value) == (
            f"output: the service names it relative to its results directory (bob/{job.id}.zarr), which it tells a "
            "client on its own machine only; here, pass results_dir= to spillway.connect (or set "
            "SPILLWAY_RESULTS_DIR) where this machine sees that directory")


def test_bad_parameters_arrive_as_the_service_message(alice):
    cases = [
        ({"size": "0x5"}, "size: '0x5'"),
        ({"size": "300x200"}, "size: 300x200 is not square"),
        ({"sise": "300x300"}, "sise: not a parameter of transpose-sum (did you mean size?)"),
        ({"size": "9000x9000"}, "exceeds this tenant's limit of 286.10 MiB per job"),
    ]
    for params, message in cases:
        with pytest.raises(ServiceError) as e:
            alice.submit("transpose-sum", params)
        assert e.value.status == 422 and message in str(e.value), (params, str(e.value))
        assert "\n" not in str(e.value)
    with pytest.raises(ServiceError) as e:
        alice.submit("transpose-summ")
    assert str(e.value) == "workflow: 'transpose-summ' is unknown (did you mean transpose-sum?)"
    with pytest.raises(ServiceError, match="has no array result to write") as e:
        alice.submit("transpose-sum", SMALL, output=True)


def test_other_tenants_jobs_are_not_found(served, alice):
    server, tokens, _ = served
    job = alice.submit("transpose-sum", SMALL)
    with spillway.connect(server.url, tokens["bob"]) as bob:
        with pytest.raises(ServiceError, match=f"job '{job.id}' not found") as e:
            bob.job(job.id)
        assert e.value.status == 404
        assert job.id not in {j.id for j in bob.jobs()}
    job.wait(timeout=60, progress=False)


def test_cancel_a_running_job(alice):
    job = alice.submit("transpose-sum", SLOW)
    wait_for(lambda: job.status()["state"] == "running", 60, "the job to start")
    with pytest.raises(TimeoutError, match=f"job {job.id} is still running after 0.5 s"):
        job.wait(timeout=0.5, progress=False)
    assert job.cancel()["cancel_requested"] is True
    with pytest.raises(JobFailed, match=f"job {job.id} \\(transpose-sum\\) was cancelled") as e:
        job.wait(timeout=60, progress=False)
    assert e.value.job is job and job.state == "cancelled"
    assert any(line.endswith("cancel requested") for line in job.logs())
    with pytest.raises(JobFailed):
        job.result()


def test_a_job_that_fails_raises_its_error(served, alice, tmp_path):
    """A Zarr input whose metadata is sound but whose chunk is corrupt passes submission
    and fails while running: wait() and result() raise JobFailed with the job's error."""
    import zarr

    _, _, state = served
    with pytest.raises(ServiceError, match="outside this tenant's data directories"):
        alice.submit("transpose-sum", {"input": str(tmp_path / "x.zarr")})
    path = Path(state["data_dir"]) / "corrupt.zarr"
    z = zarr.create_array(str(path), shape=(200, 200), chunks=(100, 100), dtype="float64", zarr_format=3)
    z[:] = 1.0
    chunk = next(p for p in path.rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.write_bytes(b"not a compressed chunk")
    job = alice.submit("transpose-sum", {"input": str(path), "chunks": "100x100"})
    with pytest.raises(JobFailed, match=f"job {job.id} \\(transpose-sum\\) failed: ") as e:
        job.wait(timeout=60, progress=False)
    assert job.state == "failed" and job.record["error"] and job.record["error"] in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(JobFailed, match="failed: "):
        job.result()
    assert job.logs()[-1].split("  ", 1)[1] == f"failed: {job.record['error']}"


def test_open_output_refuses_unknown_backends(tmp_path):
    with pytest.raises(ValueError, match="backend: 'torch' is not one of auto, numpy, cupy"):
        open_output(str(tmp_path), backend="torch")


@pytest.mark.gpu
def test_open_output_gives_cupy_chunks_on_a_gpu_machine(tmp_path):
    import cupy
    import dask.array as da

    x = np.arange(12_000, dtype=np.float64).reshape(120, 100)
    da.to_zarr(da.from_array(x, chunks=(40, 50)), str(tmp_path / "x.zarr"), zarr_format=3)
    array = open_output(str(tmp_path / "x.zarr"))
    assert isinstance(array._meta, cupy.ndarray)
    block = array.compute(scheduler="threads")
    assert isinstance(block, cupy.ndarray) and rel_error(cupy.asnumpy(block), x) == 0.0
    assert type(open_output(str(tmp_path / "x.zarr"), backend="numpy")._meta).__module__ == "numpy"


def test_wait_polls_until_done(alice):
    job = alice.submit("transpose-sum", SMALL, seed=9)
    job.wait(timeout=60, progress=False, poll_s=0.1)
    assert job.state == "done"


def test_requests_safe_to_repeat_wait_out_an_outage():
    """503 with Retry-After (the job database unreachable): reads, cancels and keyed
    submissions are sent again until the service answers; a submission without a key is
    not (it could queue the job twice) and raises with the service's line."""
    import httpx

    from spillway.service.client import ServiceClient

    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append((request.method, request.url.path))
        if len(calls) % 3:
            return httpx.Response(503, headers={"Retry-After": "0"},
                                  json={"detail": "the job database is unreachable", "retry_after_s": 1})
        return httpx.Response(200, json={"jobs": []})

    http = httpx.Client(base_url="http://service", transport=httpx.MockTransport(handler))
    client = ServiceClient(http, outage_wait_s=5)
    assert client.request("GET", "/jobs") == {"jobs": []} and len(calls) == 3
    calls.clear()
    with pytest.raises(ServiceError, match="the job database is unreachable") as e:
        client.request("POST", "/jobs", json={"workflow": "slice"})
    assert e.value.status == 503 and len(calls) == 1
    calls.clear()
    assert client.request("POST", "/jobs", json={"workflow": "slice", "idempotency_key": "k"}) == {"jobs": []}
    assert len(calls) == 3
    # bounded: a service that stays down is reported after outage_wait_s
    client.outage_wait_s = 0
    calls.clear()
    with pytest.raises(ServiceError):
        client.request("GET", "/jobs")
    assert len(calls) == 1
