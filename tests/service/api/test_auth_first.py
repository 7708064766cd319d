"""A token is checked before a body is read, and the shared-address protection never keeps
out a valid tenant (issue 74), on PostgreSQL where its binaries are installed: a 60,000-key
body without a token is answered 401 within 50 ms, unread, and a missing token counts
against its address as a wrong one does; after 2,000 bad tokens from one address, every
valid tenant at that address is served, the ones not seen since the start, one added
while the service runs, and every one again after a restart."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from serve_helpers import Server, add_tenant, free_port, postgres_if_installed

from spillway.service.api.auth import MAX_AGE_S

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

AUTH_FAILURES = 30


def serve(state) -> Server:
    return Server(state, "--cpu", "--n-workers", "1", "--max-auth-failures", str(AUTH_FAILURES)).start()


def bad_tokens(c: httpx.Client, n: int) -> dict[int, int]:
    statuses: dict[int, int] = {}
    for i in range(n):
        # a client stuck on one bad token, and a guesser, behind the same address
        bad = "spw_" + ("stuck" * 9 if i % 2 else f"{i:043d}")
        status = c.get("/jobs", headers={"Authorization": f"Bearer {bad}"}).status_code
        statuses[status] = statuses.get(status, 0) + 1
    return statuses


def test_a_body_without_a_token_is_refused_unread_and_counted(request, tmp_path):
    state = {"state_dir": str(tmp_path / "state")}
    postgres_if_installed(request, state)
    ann = add_tenant(state, "ann")
    server = serve(state)
    try:
        body = json.dumps({"workflow": "reduction", "params": {f"k{i:05d}": i for i in range(60_000)}}).encode()
        assert len(body) > 600_000
        head = (f"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        times = []
        for _ in range(10):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10,
                                          source_address=("127.0.2.1", 0)) as sock:
                start = time.perf_counter()
                sock.sendall(head)  # the headers alone: the answer must not wait for the body
                data = b""
                while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                times.append(time.perf_counter() - start)
                assert data.startswith(b"HTTP/1.1 401 "), data[:200]
                assert b"missing bearer token" in data and b"connection: close" in data.lower(), data
                assert sock.recv(1) == b""  # closed: the unread body cannot pose as a request
        # the whole body sent, by an ordinary client: 401, never the 422 that parsing it gave
        r = httpx.post(server.url + "/jobs", content=body, headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", r.text[:300]
        times.sort()
        print(f"60,000-key body without a token: 401 in median {times[5] * 1e3:.1f} ms, max {times[-1] * 1e3:.1f} ms")
        assert times[-1] < 0.050, times
        # the missing tokens counted against 127.0.2.1: a wrong token from there now waits
        transport = httpx.HTTPTransport(local_address="127.0.2.1")
        with httpx.Client(base_url=server.url, transport=transport, timeout=30) as c:
            for _ in range(AUTH_FAILURES - 10):  # ten above
                assert c.get("/jobs").status_code == 401
            r = c.get("/jobs", headers={"Authorization": "Bearer spw_" + "x" * 43})
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
            assert c.get("/jobs", headers={"Authorization": f"Bearer {ann}"}).status_code == 200
    finally:
        server.stop()


def test_every_valid_tenant_behind_2000_bad_tokens_is_served_before_and_after_a_restart(request, tmp_path):
    state = {"state_dir": str(tmp_path / "state")}
    postgres_if_installed(request, state)
    tokens = {name: add_tenant(state, name) for name in ("ann", "bob", "cat")}
    shared = f"127.0.3.{2 + free_port() % 200}"  # a NAT's address
    server = serve(state)
    try:
        with httpx.Client(base_url=server.url, transport=httpx.HTTPTransport(local_address=shared),
                          timeout=30) as c:
            assert c.get("/jobs", headers={"Authorization": f"Bearer {tokens['ann']}"}).status_code == 200
            statuses = bad_tokens(c, 2000)
            print(f"2,000 bad tokens from {shared}: {statuses}")
            assert set(statuses) == {401, 429} and statuses[429] >= 1900, statuses
            for name in ("ann", "bob", "cat"):  # bob and cat never seen before
                r = c.get("/jobs", headers={"Authorization": f"Bearer {tokens[name]}"})
                assert r.status_code == 200, (name, r.text)
            tokens["dan"] = add_tenant(state, "dan")  # added while the service runs
            r = c.get("/jobs", headers={"Authorization": f"Bearer {tokens['dan']}"})
            if r.status_code == 429:  # the live tokens were read before dan was added: told when next
                wait = int(r.headers["retry-after"])
                assert 1 <= wait <= 3, r.headers
                time.sleep(wait)
                r = c.get("/jobs", headers={"Authorization": f"Bearer {tokens['dan']}"})
            assert r.status_code == 200, r.text
            r = c.get("/jobs", headers={"Authorization": "Bearer spw_" + "n" * 43})
            assert r.status_code == 429, r.text
    finally:
        server.stop()
    server = serve(state)
    try:
        with httpx.Client(base_url=server.url, transport=httpx.HTTPTransport(local_address=shared),
                          timeout=30) as c:
            statuses = bad_tokens(c, 2000)
            assert statuses.get(429, 0) >= 1900, statuses
            for name in ("ann", "bob", "cat", "dan"):
                r = c.get("/jobs", headers={"Authorization": f"Bearer {tokens[name]}"})
                assert r.status_code == 200, (name, r.text)
            # a revoked token is no live one: it waits with the guesses
            from serve_helpers import spillway, state_args

            assert spillway("tenant", "revoke", "cat", *state_args(state)).returncode == 0
            # the service holds the tokens in memory (issue 74): the revocation is seen within
            # MAX_AGE_S, and the token is no live one from then on
            time.sleep(MAX_AGE_S)
            r = c.get("/jobs", headers={"Authorization": f"Bearer {tokens['cat']}"})
            assert r.status_code == 429, r.text
    finally:
        server.stop()
