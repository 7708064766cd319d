"""What one request may cost, against a real `spillway serve` on loopback: a body over the
limit gets 413 before it is read, parsed or authenticated; a body sent too slowly, or
shorter than its Content-Length, gets 408 and the connection closed within the body
timeout; /healthz stays under 100 ms while large requests are refused."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from serve_helpers import Server, add_tenant

LIMIT = 2**20
BODY_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    state = {"state_dir": str(tmp_path_factory.mktemp("limits") / "state")}
    token = add_tenant(state, "ann")
    server = Server(state, "--cpu", "--n-workers", "1", "--body-timeout", str(BODY_TIMEOUT_S)).start()
    try:
        yield server, token
    finally:
        server.stop()


def _connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=15)
    return sock


def _response(sock: socket.socket) -> tuple[int, dict, dict, bool]:
    """(status, headers, JSON body, whether the server then closed the connection)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", 0))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    body = json.loads(rest[:length]) if length else {}
    try:
        closed = sock.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        closed = True
    return status, headers, body, closed


def _head(server, length: int | None, token: str | None = None, chunked: bool = False) -> bytes:
    lines = ["POST /jobs HTTP/1.1", f"Host: 127.0.0.1:{server.port}", "Content-Type: application/json"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    elif length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize("token", [None, "spw_not-a-token", "valid"])
def test_declared_oversize_body_is_413_before_it_is_read_or_authenticated(service, token):
    server, valid = service
    with _connect(server) as sock:
        sock.sendall(_head(server, 50_000_000, valid if token == "valid" else token))
        status, headers, body, closed = _response(sock)
    assert status == 413, body
    assert body["detail"] == ("request body: Content-Length 50000000 bytes exceeds the service's limit of "
                              "1.00 MiB (1048576 bytes)")
    assert headers["content-type"] == "application/json"
    assert closed


def test_streamed_oversize_body_is_413_and_without_a_token_401_unread(service):
    server, token = service
    with _connect(server) as sock:
        sock.sendall(_head(server, None, None, chunked=True) + b"10000\r\n")
        status, _, body, closed = _response(sock)  # nothing of the body was waited for
    assert status == 401 and body["detail"].startswith("missing bearer token"), body
    assert closed
    with _connect(server) as sock:
        sock.sendall(_head(server, None, token, chunked=True))
        chunk = b"x" * 65536
        sent = 0
        try:
            while sent <= 4 * LIMIT:
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, _, body, closed = _response(sock)
    assert status == 413 and body["detail"].startswith("request body: more than 1.00 MiB"), body
    assert closed
    # a small body without a token is refused by authentication, not by the limit
    assert httpx.post(server.url + "/jobs", json={"workflow": "slice"}, timeout=10).status_code == 401


def test_a_client_sees_the_413(service):
    """An ordinary HTTP client that sends a too-large body gets the 413, not a reset."""
    server, token = service
    r = httpx.post(server.url + "/jobs", content=b"[" + b"0," * LIMIT + b"0]",
                   headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 413 and "1.00 MiB" in r.json()["detail"]


def test_body_shorter_than_its_length_gets_408_within_the_timeout(service):
    server, token = service
    with _connect(server) as sock:
        sock.sendall(_head(server, 1000, token) + b'{"workflow":')
        status, headers, body, closed = _response(sock)
    # the service waited out its timeout for the rest of the body, then closed
    assert status == 408, body
    assert body["detail"] == ("request body: 12 of 1000 bytes received in 2 s, the service's limit; "
                              "send the whole body at once")
    assert closed


def test_a_dribbled_body_gets_408_though_each_byte_is_prompt(service):
    server, token = service
    body = json.dumps({"workflow": "slice", "params": {}}).encode() + b" " * 200
    with _connect(server) as sock:
        sock.sendall(_head(server, len(body), token))
        start = time.perf_counter()
        for i in range(len(body)):
            try:
                sock.sendall(body[i:i + 1])
            except (BrokenPipeError, ConnectionResetError):
                break
            if time.perf_counter() - start > BODY_TIMEOUT_S + 0.5:
                break
            time.sleep(0.05)
        status, _, detail, closed = _response(sock)
    assert status == 408, detail
    assert closed


def test_healthz_stays_fast_while_large_requests_are_refused(service):
    server, token = service
    stop = threading.Event()
    refused = []
    refused_at = []  # when each flooded request was answered

    def flood():
        big = b"x" * (40 * 2**20)
        while not stop.is_set():
            try:
                with _connect(server) as sock:
                    sock.sendall(_head(server, len(big), token))
                    try:
                        sock.sendall(big)
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                    refused.append(_response(sock)[0])
                    refused_at.append(time.monotonic())
            except OSError:
                refused.append("reset")

    def streamed():
        while not stop.is_set():
            with httpx.Client(timeout=10) as c:
                try:
                    r = c.post(server.url + "/jobs", content=(b"y" * 65536 for _ in range(64)),
                               headers={"Authorization": f"Bearer {token}"})
                    refused.append(r.status_code)
                except httpx.HTTPError:
                    refused.append("reset")

    threads = [threading.Thread(target=flood), threading.Thread(target=streamed)]
    for t in threads:
        t.start()
    times, answered_at = [], []
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            c.get("/healthz")
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                start = time.perf_counter()
                r = c.get("/healthz")
                times.append(time.perf_counter() - start)
                answered_at.append(time.monotonic())
                assert r.status_code == 200 and r.json()["status"] == "ok"
                time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert refused.count(413) >= 5, refused
    times.sort()
    print(f"/healthz while {len(refused)} large requests were refused: median {times[len(times) // 2] * 1e3:.1f} ms, "
          f"max {times[-1] * 1e3:.1f} ms over {len(times)}")
    # every /healthz answered 200 (above), and some between two refusals of the flood: the
    # service kept answering while it refused
    assert any(refused_at[0] < t < refused_at[-1] for t in answered_at), (refused_at[:3], answered_at[:3])
