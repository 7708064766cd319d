"""Issue 53's smaller items, on the app and its parts without a cluster: every method of a
path in ``Allow``; ``/docs`` served from the service's own files; a lone surrogate in a
path refused as a parameter (no traceback in the log); tenant names of printable text;
health and 503 answers without the database's address; guessed tokens counted per
address; ``/metrics``' database and worker readings shared between scrapes."""

from __future__ import annotations

import json
import logging
import re
from unittest import mock

import pytest
from sqlalchemy.exc import OperationalError

from spillway.options.errors import ParamError
from spillway.service.api.auth import AuthFailures
from spillway.service.api.errors import unavailable
from spillway.service.api.log_text import printable
from spillway.service.api.metrics import Cached
from spillway.service.jobdb import JobDB
from spillway.service.jobdb.errors import JobDBError
from spillway.service.jobdb.health import DatabaseHealth
from spillway.workflows.params import Param


@pytest.fixture(scope="module")
def client():
    from fastapi.testclient import TestClient

    from spillway.service.api import create_app

    return TestClient(create_app(mock.MagicMock(), mock.MagicMock()))


def test_every_method_of_a_path_is_allowed(client):
    r = client.options("/jobs")
    assert r.status_code == 204 and r.headers["allow"] == "GET, HEAD, OPTIONS, POST"  # was "POST"
    r = client.request("DELETE", "/jobs")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD, OPTIONS, POST"
    assert client.options("/jobs/" + "a" * 32).headers["allow"] == "GET, HEAD, OPTIONS"
    assert client.options("/nowhere").status_code == 404


def test_docs_load_nothing_from_elsewhere(client):
    r = client.get("/docs")
    assert r.status_code == 200
    urls = re.findall(r'(?:src|href|url)\s*[=:]\s*["\']([^"\']+)["\']', r.text)
    assert urls and all(u.startswith("/") for u in urls), urls  # no CDN
    for url in urls:
        assert client.get(url).status_code == 200, url
    assert client.get("/redoc").status_code == 404  # ReDoc loads from a CDN: not offered


def test_a_lone_surrogate_in_a_path_is_a_parameter_error(caplog):
    with pytest.raises(ParamError, match="input: .* contains a lone surrogate"):
        Param("input", "path", "x")._parse_path("/data/\ud800.zarr")
    # and the log writes one escaped, never failing to encode it
    assert printable("a\ud800b\x1b") == "a\\ud800b\\x1b"
    assert printable("a\ud800b").encode("utf-8")


def test_tenant_names_are_printable(tmp_path):
    jobdb = JobDB.open(str(tmp_path))
    try:
        with pytest.raises(JobDBError, match="control characters"):
            jobdb.add_tenant("eve\x1b[2J")
        assert jobdb.add_tenant("ève-2")[0]["name"] == "ève-2"
    finally:
        jobdb.close()


def test_health_says_the_kind_of_failure_not_the_database_address():
    health = DatabaseHealth()
    driver = Exception('connection failed: connection to server at "10.1.2.3", port 5433 failed: refused')
    health.failed(OperationalError("SELECT 1", {}, driver))
    assert "10.1.2.3" in health.error  # the service's log has it
    shown = json.dumps(health.as_dict()) + unavailable(health).body.decode()
    assert "10.1.2.3" not in shown and "5433" not in shown
    assert health.as_dict()["error"] == "no answer (Exception)"


def test_failed_tokens_are_counted_per_address():
    failures = AuthFailures(limit=3, window_s=60)
    for _ in range(3):
        assert failures.retry_after_s("10.0.0.1") is None
        failures.failed("10.0.0.1")
    wait = failures.retry_after_s("10.0.0.1")
    assert wait is not None and 1 <= wait <= 60
    assert failures.retry_after_s("10.0.0.2") is None
    bounded = AuthFailures(limit=1, max_keys=10)
    for i in range(100):
        bounded.failed(f"10.0.1.{i}")
    assert len(bounded._failures) == 20


def test_a_token_that_keeps_failing_is_held_back_by_its_own_count():
    """issue 74: the address's count decides only for tokens that are no live one (the
    route asks :class:`KnownTokens`); a token stuck failing is held back on its own."""
    failures = AuthFailures(limit=3, window_s=60)
    for i in range(2000):
        failures.failed("10.0.0.1", "stuck" if i % 2 else f"guess-{i}")
    assert failures.held_back("10.0.0.1", "unseen")[1] == "address"
    assert failures.held_back("10.0.0.1", "stuck")[1] == "token"
    assert failures.held_back("10.0.0.2", "stuck") is None
    failures.failed("10.0.0.3")  # a missing token counts against its address
    failures.failed("10.0.0.3")
    failures.failed("10.0.0.3")
    assert failures.held_back("10.0.0.3", "any")[1] == "address"


def test_known_tokens_are_read_at_most_once_per_interval():
    """issue 74: tokens are decided from the table in memory, however many are guessed; it
    is read again only once it is older than its bound."""
    from spillway.service.api.auth import KnownTokens

    reads = []

    class Books:
        def live_tokens(self):
            reads.append(1)
            return [("a" * 64, None, {"id": 1, "name": "ann", "token_id": 1, "token_expires": None})]

    known = KnownTokens(Books(), refresh_s=60, max_age_s=60)
    known.ensure_fresh()
    known.stop()  # no reader thread: the reads counted are the requests' own
    assert known.known("a" * 64) and not known.known("b" * 64)
    for _ in range(100):
        known.ensure_fresh()
        assert not known.known("c" * 64)
        assert known.tenant("c" * 64) == (None, "invalid or revoked token")
    assert known.tenant("a" * 64)[0]["name"] == "ann"
    assert len(reads) == 1 and 1 <= known.next_read_in_s() <= 61


def test_metrics_readings_are_shared_between_scrapes():
    calls = []

    class Counting:
        def collect(self):
            calls.append(1)
            yield from ()

    cached = Cached(Counting(), max_age_s=60)
    for _ in range(5):
        list(cached.collect())
    assert len(calls) == 1
    cached.max_age_s = 0
    list(cached.collect())
    assert len(calls) == 2


def test_the_log_filter_escapes_a_surrogate_in_a_message():
    from spillway.service.api.log_text import EscapeControl

    record = logging.LogRecord("spillway.api", logging.WARNING, __file__, 1, "path %s", ("/jobs/\ud800",), None)
    EscapeControl().filter(record)
    assert record.getMessage() == "path /jobs/\\ud800"


@pytest.fixture(scope="module")
def guarded_server():
    """uvicorn with the service's connection guard over an app that answers a body's length."""
    import socket
    import threading
    import time

    import uvicorn

    from spillway.service.api.connections import ConnectionStats, guarded_protocol
    from spillway.service.api.settings import ServiceLimits

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        size, more = 0, True
        while more:
            message = await receive()
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        body = str(size).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stats = ConnectionStats()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws="none",
                                           http=guarded_protocol(ServiceLimits(), stats)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield port, stats
    server.should_exit = True
    thread.join(10)


def _exchange(port: int, *parts: bytes) -> bytes:
    import socket
    import time

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for part in parts:
            sock.sendall(part)
            time.sleep(0.1)  # each part a read of its own
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
                if b"\r\n\r\n" in data and data.split(b"\r\n\r\n", 1)[1]:
                    break
        except ConnectionResetError:
            pass
    return data


def test_headers_past_the_limit_get_431_and_a_large_body_after_them_does_not(guarded_server):
    port, stats = guarded_server
    body = b"x" * 200_000
    # the end of the headers straddles two reads, the second carrying 200 kB of body
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(body)
    answer = _exchange(port, head + b"\r", b"\n" + body)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"200000"), answer[:200]
    before = stats.headers_too_large
    answer = _exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 40_000, b"a" * 40_000)
    assert stats.headers_too_large == before + 1
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431"), answer[:200]


def test_a_submission_the_cluster_cannot_size_is_told_to_retry_and_nothing_is_queued(tmp_path):
    from fastapi.testclient import TestClient

    from spillway.service.api import create_app

    jobdb = JobDB(f"sqlite:///{tmp_path / 'jobs.db'}")
    _, token = jobdb.add_tenant("ann")
    queue = mock.MagicMock()
    queue.tiers.side_effect = OSError("Timed out trying to connect to tls://10.0.0.7:8786")
    client = TestClient(create_app(jobdb, queue))
    r = client.post("/jobs", json={"workflow": "reduction", "params": {"size": "1000x1000"}},
                    headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 503, r.text
    assert int(r.headers["Retry-After"]) > 0 and r.json()["retry_after_s"] == int(r.headers["Retry-After"])
    # the cluster's address stays the service's own
    assert "10.0.0.7" not in r.text and "OSError" in r.json()["detail"]
    queue.footprint.assert_not_called()
    assert jobdb.jobs() == []


def test_a_repeated_key_is_refused_before_it_collapses(client):
    """issue 74: 60,000 copies of one key passed the cap on params as one key."""
    from fastapi.testclient import TestClient

    from spillway.service.api import create_app

    body = '{"workflow": "reduction", "params": {' + ", ".join(['"op": "sum"'] * 60_000) + "}}"
    jobdb = mock.MagicMock()
    jobdb.health.down = False
    # the gate passes a token the database holds
    jobdb.live_tokens.return_value = [(hashlib_hex("spw_x"), None, {"id": 1, "name": "ann", "admin": False,
                                                                     "max_job_bytes": None, "token_id": 1,
                                                                     "token_expires": None})]
    r = TestClient(create_app(jobdb, mock.MagicMock())).post(
        "/jobs", content=body, headers={"Content-Type": "application/json", "Authorization": "Bearer spw_x"})
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert error["loc"] == ["body"]
    assert error["msg"] == ("body: key 'op' appears more than once in one object (60000 keys, 1 distinct); "
                            "give each key once")


def test_the_page_sends_a_policy_that_allows_its_own_script_alone(client):
    r = client.get("/ui")
    assert r.status_code == 200
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert "script-src 'sha256-" in csp and "connect-src 'self'" in csp
    assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
    import base64
    import hashlib
    import re

    script = re.search(r"<script>(.*?)</script>", r.text, flags=re.S).group(1)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"'sha256-{digest}'" in csp


def test_healthz_tells_a_caller_without_a_live_token_only_whether_it_is_up():
    from fastapi.testclient import TestClient

    from spillway.service.api import create_app

    jobdb, queue = mock.MagicMock(), mock.MagicMock()
    jobdb.health.checked, jobdb.health.down = 1.0, False
    jobdb.health.counts = {"queued": 3, "running": 1}
    jobdb.health.as_dict.return_value = {"ok": True, "error": None, "down_since": None, "checked": None}
    jobdb.engine.dialect.name = "sqlite"
    jobdb.live_tokens.return_value = [(hashlib_hex("spw_good"), None, {"id": 1, "name": "ann", "token_id": 1})]
    queue.session.client.status = "running"
    queue.session.kind, queue.session.n_workers = "cpu", 2
    app = create_app(jobdb, queue)
    app.state.known_tokens.refresh()
    c = TestClient(app)
    assert c.get("/healthz").json() == {"status": "ok"}
    assert c.get("/healthz", headers={"Authorization": "Bearer spw_bad"}).json() == {"status": "ok"}
    full = c.get("/healthz", headers={"Authorization": "Bearer spw_good"}).json()
    assert full["workers"] == 2 and full["queued"] == 3 and full["kind"] == "cpu"


def hashlib_hex(token: str) -> str:
    import hashlib

    return hashlib.sha256(token.encode()).hexdigest()


def test_body_timeouts_are_counted_for_metrics():
    import asyncio

    from spillway.service.api.limits import BodyStats, RequestLimits
    from spillway.service.api.metrics import BodyCollector
    from spillway.service.api.settings import ServiceLimits

    stats = BodyStats()
    sent = []

    async def inner(scope, receive, send):
        raise AssertionError("the app is never reached")

    async def receive():
        await asyncio.sleep(10)

    async def send(message):
        sent.append(message)

    limits = RequestLimits(inner, ServiceLimits(body_timeout_s=0.1), stats=stats)
    scope = {"type": "http", "headers": [(b"content-length", b"100")]}
    for _ in range(3):
        asyncio.run(limits(scope, receive, send))
    assert stats.timed_out == 3 and sent[0]["status"] == 408
    (family, _) = list(BodyCollector(stats).collect())
    assert family.name == "spillway_http_body_timeouts" and family.samples[0].value == 3
