"""The service refuses a job its cluster cannot hold for that, in bytes: a real `spillway
serve` on loopback with one CPU worker answers 422 naming the projected footprint and the
device + host + disk capacity, not the chunks of a size nobody could run."""

from __future__ import annotations

import re

import pytest
from serve_helpers import Server, add_tenant


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    state = {"state_dir": str(tmp_path_factory.mktemp("serve") / "state")}
    token = add_tenant(state, "carol")
    server = Server(state, "--cpu", "--n-workers", "1", "--memory-limit", "1GB").start()
    client = server.client(token)
    try:
        yield client
    finally:
        client.close()
        server.stop()


def _refusal(client, params: dict) -> str:
    r = client.post("/jobs", json={"workflow": "transpose-sum", "params": params})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert len(detail) == 1 and detail[0]["loc"] == ["body", "params"], detail
    return detail[0]["msg"]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("params", [
    {"size": "1PB"},
    # whatever else is wrong with it, the size is what it is refused for
    {"size": "1PB", "chunks": "10x10"},
    {"size": "1PB", "seed": -1},
])
def test_a_petabyte_job_is_refused_in_bytes(service, params):
    msg = _refusal(service, params)
    assert msg.startswith("transpose-sum: projected footprint 909.49 TiB exceeds the cluster's "
                          "device + host + disk capacity "), msg
    assert re.search(r"capacity [\d.]+ \w+ \(device 0 B \+ host tier 0\.93 GiB \+ disk [\d.]+ \w+ "
                     r"\([\d.]+ \w+ free less a reserve of [\d.]+ \w+\), 1 worker\)$", msg), msg
    assert "chunk" not in msg


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_job_that_fits_still_has_its_chunks_counted(service):
    r = service.post("/jobs", json={"workflow": "transpose-sum", "params": {"size": "2000x2000", "chunks": "1x1"}})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["body", "params", "chunks"]
    assert "chunks: 1x1 makes 4000000 chunks of the 2000x2000 array" in detail["msg"]
    assert service.get("/jobs").json()["jobs"] == []
