"""NUL and other control characters in every part of every route, against a real `spillway
serve` on loopback over PostgreSQL (SQLite where PostgreSQL is not installed): never a 5xx,
a clean 404 or 422 instead (a NUL in a job id was a 500 from PostgreSQL, issue 45), and
the service's log holds no raw control character."""

from __future__ import annotations

import re
import socket
from urllib.parse import quote

import pytest
from serve_helpers import Server, add_tenant, postgres_if_installed

#: what goes into a path segment or a query value, percent-encoded as a client sends it
NASTY = ["abc\x00", "\x00", "\x01", "\x1b[31mred", "a\r\nX-Injected: 1", "\x7f", "\x85", "\ufffe",
         "0" * 31 + "\x00", "0123456789abcdef0123456789abcde\x00", "../../etc/passwd", "%00", "a" * 5000,
         "0123456789ABCDEF0123456789ABCDEF"]


@pytest.fixture(scope="module")
def service(request, tmp_path_factory):
    state = {"state_dir": str(tmp_path_factory.mktemp("control") / "state")}
    postgres_if_installed(request, state)
    tokens = {"ann": add_tenant(state, "ann"), "root": add_tenant(state, "root", "--admin")}
    server = Server(state, "--cpu", "--n-workers", "1").start()
    try:
        yield server, tokens
    finally:
        server.stop()


def _routes(server) -> list[tuple[str, str]]:
    spec = server.client().get("/openapi.json").json()
    return [(method.upper(), path) for path, ops in spec["paths"].items() for method in ops]


def _raw(server, method: str, target: str, headers: dict[str, str] | None = None, body: bytes = b"") -> int | str:
    """One request with exactly these bytes (no client library to clean them up)."""
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close",
             f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall("\r\n".join(lines).encode() + b"\r\n\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else "closed"


def test_no_route_answers_5xx_to_control_characters(service):
    server, tokens = service
    statuses: dict[int | str, int] = {}
    routes = _routes(server)
    assert ("GET", "/jobs/{job_id}") in routes and ("POST", "/jobs/{job_id}/cancel") in routes
    for token in (None, tokens["ann"], tokens["root"]):
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        for method, path in routes:
            params = re.findall(r"{(\w+)}", path)
            for value in NASTY:
                target = path
                for p in params:
                    target = target.replace("{" + p + "}", quote(value, safe=""))
                targets = [target] if params else []
                # every route also gets the value in a query string, as a known and an unknown name
                targets += [f"{target.split('?')[0]}?state={quote(value, safe='')}&limit={quote(value, safe='')}",
                            f"{target.split('?')[0]}?{quote(value, safe='')}=1"]
                for t in targets:
                    status = _raw(server, method, t, auth)
                    statuses[status] = statuses.get(status, 0) + 1
                    assert status == "closed" or status < 500, (method, t, status)
    # in headers (the HTTP parser refuses raw control characters with 400) and in JSON bodies
    for value in NASTY:
        for header in ("Idempotency-Key", "X-Anything"):
            status = _raw(server, "POST", "/jobs", {"Authorization": f"Bearer {tokens['ann']}",
                                                     header: value.replace("\r\n", " ")})
            statuses[status] = statuses.get(status, 0) + 1
            assert status == "closed" or status < 500, (header, value, status)
        escaped = value.encode("unicode_escape").decode().replace('"', '\\"').replace("\\x", "\\u00")
        for body in ('{"workflow": "%s"}', '{"workflow": "slice", "params": {"%s": 1}}',
                     '{"workflow": "slice", "params": {"input": "%s"}}',
                     '{"workflow": "slice", "idempotency_key": "%s"}'):
            status = _raw(server, "POST", "/jobs", {"Authorization": f"Bearer {tokens['ann']}",
                                                     "Content-Type": "application/json"},
                          (body % escaped).encode())
            statuses[status] = statuses.get(status, 0) + 1
            assert status == "closed" or status < 500, (body % escaped, status)
    print("statuses:", dict(sorted(statuses.items(), key=str)))
    assert not any(isinstance(s, int) and s >= 500 for s in statuses)
    # a job id that is not one is refused before the database: 422, or 404 where no route
    # matches; /metrics is 403 for a tenant's token (an admin's only)
    assert set(statuses) <= {200, 201, 400, 401, 403, 404, 405, 409, 422, "closed"}, statuses
    log = server.log.read_bytes()
    assert not re.search(rb"[\x00-\x08\x0b-\x1f\x7f]", log), log[-2000:]
    assert b"Traceback" not in log and b"job database error" not in log, log[-3000:]


def test_a_malformed_job_id_is_422_and_an_unknown_one_404(service):
    server, tokens = service
    with server.client(tokens["ann"]) as c:
        for path in ("/jobs/abc%00", "/jobs/abc%00/result", "/jobs/abc%00/logs"):
            r = c.get(path)
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "job_id"], r.text
        r = c.post("/jobs/abc%00/cancel")
        assert r.status_code == 422, r.text
        r = c.get("/jobs/" + "0" * 32)
        assert r.status_code == 404 and r.json()["detail"] == f"job {'0' * 32!r} not found"
