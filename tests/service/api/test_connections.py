"""What a client may hold before it has sent a request, against a real `spillway serve` on
loopback: headers sent slowly get 408 and the connection closed at the header deadline,
whatever the client keeps sending; one address holds at most its cap of connections; at
the total cap the oldest connection still sending headers makes room; a trusted proxy is
not capped; /healthz stays fast throughout, and /metrics counts it all.

Bounded: 300 slow connections from six loopback addresses, a 2 s deadline, a few seconds
each (the README's 3,000-connection figure comes from the same client, scaled up)."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from serve_helpers import Server, add_tenant, healthz_once, slow_clients, spillway, state_args, wait_for

HEADER_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 256
PER_CLIENT = 64
PROXY = "127.0.0.10"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    state = {"state_dir": str(tmp_path_factory.mktemp("connections") / "state")}
    token = add_tenant(state, "ann")
    state["admin"] = add_tenant(state, "ops", "--admin")  # /metrics
    server = Server(state, "--cpu", "--n-workers", "1", "--header-timeout", str(HEADER_TIMEOUT_S),
                    "--max-connections", str(MAX_CONNECTIONS), "--max-connections-per-client", str(PER_CLIENT),
                    "--trusted-proxy", PROXY).start()
    try:
        yield server, token
    finally:
        server.stop()


# --- a slow client: headers one byte at a time (asyncio, in a thread of its own)


def _metrics(server) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", timeout=10,
                     headers={"Authorization": f"Bearer {server.state['admin']}"}).text
    out = {}
    for line in text.splitlines():
        if line.startswith("spillway_http"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_slow_headers_are_cut_at_the_deadline_and_healthz_stays_fast(service):
    server, _ = service
    before = _metrics(server)
    sources = [f"127.0.0.{i}" for i in range(2, 8)]  # 6 addresses, 50 connections each: under the per-client cap
    n = 300
    result: list[dict] = []
    attack = threading.Thread(target=lambda: result.extend(asyncio.run(
        slow_clients(server.port, sources, n, interval=0.1, duration=HEADER_TIMEOUT_S + 4))))
    attack.start()
    probes = []  # (seconds, status, when it was answered)
    try:
        while attack.is_alive():
            probes.append((*healthz_once(server.port), time.monotonic()))
            time.sleep(0.05)
    finally:
        attack.join(60)
    assert len(result) == n and not any("error" in r for r in result), [r for r in result if "error" in r][:3]
    lifetimes = sorted(r["closed"] - r["opened"] for r in result)
    answers: dict[str, int] = {}
    for r in result:
        answers[r.get("answer", "-")] = answers.get(r.get("answer", "-"), 0) + 1
    times = sorted(t for t, _, _ in probes)
    print(f"{n} slow connections: closed after {lifetimes[0]:.3f}-{lifetimes[-1]:.3f} s, answers {answers}; "
          f"{len(probes)} /healthz: median {times[len(times) // 2] * 1e3:.1f} ms, max {times[-1] * 1e3:.1f} ms")
    # every one cut by the service, never by the client giving up (it drips for the deadline
    # and 4 s more, then aborts, which leaves no answer): those the total cap holds with 408,
    # the oldest evicted (503) as the last ones arrived (a probe in flight holds a slot too)
    timeouts, evicted = answers.get("HTTP/1.1 408 Request Timeout", 0), answers.get("HTTP/1.1 503 Service Unavailable")
    assert timeouts + evicted == n and MAX_CONNECTIONS - 3 <= timeouts <= MAX_CONNECTIONS, answers
    assert all(status == 200 for _, status, _ in probes), [p for p in probes if p[1] != 200][:5]
    # /healthz was answered while the slow connections held the service at its cap
    def held_at(t: float) -> int:
        return sum(1 for r in result if r["opened"] <= t < r["closed"])
    assert max(held_at(at) for _, _, at in probes) >= MAX_CONNECTIONS // 2, [held_at(at) for _, _, at in probes]
    after = _metrics(server)
    assert after["spillway_http_header_timeouts_total"] - before.get("spillway_http_header_timeouts_total", 0) \
        == timeouts
    assert after["spillway_http_connections_evicted_total"] - before.get("spillway_http_connections_evicted_total",
                                                                         0) == evicted
    assert after["spillway_http_connections_waiting"] == 0


def _hold(port: int, source: str, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
        socks.append(s)
    return socks


def _answer(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def test_one_address_holds_at_most_its_cap(service):
    server, token = service
    held = _hold(server.port, "127.0.0.20", PER_CLIENT)
    try:
        # each held connection sends a complete request on time: none is cut
        for s in held[:3]:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        with socket.create_connection(("127.0.0.1", server.port), timeout=5,
                                      source_address=("127.0.0.20", 0)) as extra:
            answer = _answer(extra)
        # refused (503), not held until the header deadline (which would answer 408)
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable") and b"retry-after: 1" in answer, answer
        # another address is served meanwhile
        assert healthz_once(server.port, "127.0.0.21")[1] == 200
        for s in held[:3]:
            assert s.recv(65536).startswith(b"HTTP/1.1 200 OK")
    finally:
        for s in held:
            s.close()
    # served again once the service has seen them close
    wait_for(lambda: healthz_once(server.port, "127.0.0.20")[1] == 200, 60, "127.0.0.20 to be served again")
    assert _metrics(server)["spillway_http_connections_refused_total{cap=\"client\"}"] >= 1


def test_a_trusted_proxy_is_not_capped_but_keeps_the_deadline(service):
    server, _ = service
    held = _hold(server.port, PROXY, PER_CLIENT + 10)
    try:
        # all past the per-client cap held (none refused with 503), each cut at the deadline
        answers = [_answer(s) for s in held]
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers), {a[:30] for a in answers}
    finally:
        for s in held:
            s.close()


class _Conn:
    """One kept-alive connection read through a buffer (pipelined answers arrive together)."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""

    def send(self, raw: bytes):
        self.sock.sendall(raw)

    def answer(self) -> tuple[int, bytes]:
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            assert chunk, "the service closed the connection"
            self.buffer += chunk
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        length = int([v for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")[1:])
                      if k.lower() == b"content-length"][0])
        while len(rest) < length:
            rest += self.sock.recv(65536)
        self.buffer = rest[length:]
        return int(head.split(b" ", 2)[1]), rest[:length]

    def request(self, raw: bytes) -> tuple[int, bytes]:
        self.send(raw)
        return self.answer()

    def close(self):
        self.sock.close()


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def test_kept_alive_connections_and_bodies_are_not_cut(service):
    server, token = service
    conn = _Conn(server.port)
    try:
        for _ in range(20):
            assert conn.request(HEALTHZ)[0] == 200
        # idle past the header deadline (but within uvicorn's 5 s keep-alive), then a request
        time.sleep(HEADER_TIMEOUT_S + 0.5)
        assert conn.request(HEALTHZ)[0] == 200
        # prompt headers, then a body trickled past the header deadline: the body has its own
        body = json.dumps({"workflow": "slice", "params": {"size": "300x300"}}).encode()
        conn.send(b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + token.encode() + b"\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n")
        step = len(body) // 6 + 1
        for i in range(0, len(body), step):
            conn.send(body[i:i + step])
            time.sleep((HEADER_TIMEOUT_S + 1) / 6)
        status, answer = conn.answer()
        assert status == 201, answer
        # three pipelined requests in one write
        conn.send(HEALTHZ * 3)
        assert [conn.answer()[0] for _ in range(3)] == [200, 200, 200]
    finally:
        conn.close()


def test_a_dribbled_next_request_gets_408(service):
    server, _ = service
    conn = _Conn(server.port)
    try:
        assert conn.request(HEALTHZ)[0] == 200
        cut = False
        # 140 bytes 0.1 s apart: the dribble outlasts the deadline several times over
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-a: " + b"b" * 100:
            conn.send(bytes([byte]))
            if select.select([conn.sock], [], [], 0.1)[0]:
                cut = True  # the service answered before the client ran out of bytes
                break
        answer = _answer(conn.sock)
    finally:
        conn.close()
    assert cut and answer.startswith(b"HTTP/1.1 408 Request Timeout"), answer


def test_the_fd_limit_is_raised_and_the_cap_kept_below_half_of_it():
    code = ("import resource; from spillway.service.api.connections import raise_fd_limit\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 1024))\n"
            "print(raise_fd_limit(500))\n"
            "try:\n    raise_fd_limit(512)\nexcept Exception as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "(1024, 1024)",
        "max-connections: 512 must stay below half of this process's file-descriptor limit (1024, hard limit "
        "1024); lower --max-connections or raise the limit (ulimit -n, LimitNOFILE= in the systemd unit)"]


def test_serve_refuses_caps_it_cannot_hold(tmp_path):
    state = {"state_dir": str(tmp_path / "state")}
    for args, message in [(["--max-connections", "1000000000"], "max-connections: 1000000000 must be a whole number "
                                                                  "from 1 to 1000000"),
                          (["--max-connections", "100", "--max-connections-per-client", "101"],
                           "max-connections-per-client: 101 must be a whole number from 1 to 100"),
                          (["--header-timeout", "0"], "header-timeout: 0.0 must be from 0.1 to 3600 seconds"),
                          (["--trusted-proxy", "proxy.example"], "trusted-proxy: 'proxy.example' is not an IP "
                                                                 "address or network")]:
        out = spillway("serve", "--cpu", *state_args(state), *args, timeout=60)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr
