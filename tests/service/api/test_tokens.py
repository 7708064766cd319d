"""Token expiry and rotation through the real `spillway tenant` commands and a real
`spillway serve`: a rotation keeps the tenant working throughout, an expired token gets
401 with one line naming the expiry, and each token's last use is recorded."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest
from serve_helpers import Server, add_tenant, spillway, state_args


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    state = {"state_dir": str(tmp_path_factory.mktemp("tokens") / "state")}
    first = add_tenant(state, "ann")
    server = Server(state, "--cpu", "--n-workers", "1").start()
    try:
        yield server, state, first
    finally:
        server.stop()


def _token(state, *args) -> str:
    out = spillway("tenant", "token", "ann", *args, *state_args(state))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_rotation_expiry_and_last_use(service):
    server, state, first = service
    with server.client(first) as c:
        assert c.get("/jobs").status_code == 200
    # long enough for the commands below, each a Python start: timed here, on this machine
    # as loaded as it is now, rather than a fixed 15 s that a busy one outlasts
    start = time.monotonic()
    assert spillway("tenant", "tokens", "ann", *state_args(state)).returncode == 0
    lifetime = max(15, round(8 * (time.monotonic() - start)))
    second = _token(state, "--keep-old", "--expires-in", f"{lifetime}s")
    expires = json.loads(spillway("tenant", "tokens", "ann", "--json", *state_args(state)).stdout)[1]["expires"]
    # during the rotation both tokens work
    with server.client(first) as old, server.client(second) as new:
        assert old.get("/jobs").status_code == 200 and new.get("/jobs").status_code == 200
    out = spillway("tenant", "revoke-token", "ann", "--old", *state_args(state))
    assert out.returncode == 0 and out.stdout.strip() == "tenant ann: revoked token(s) 1", out.stdout
    with server.client(first) as old, server.client(second) as new:
        r = old.get("/jobs")
        assert r.status_code == 401 and r.json()["detail"] == "invalid or revoked token"
        assert new.get("/jobs").status_code == 200
        time.sleep(max(0.0, datetime.fromisoformat(expires).timestamp() - time.time()) + 0.2)
        r = new.get("/jobs")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    detail = r.json()["detail"]
    assert detail.startswith(f"token expired at {expires[:19]}") and "spillway tenant token ann" in detail and "\n" not in detail

    tokens = json.loads(spillway("tenant", "tokens", "ann", "--json", *state_args(state)).stdout)
    assert [(t["id"], t["revoked"] is not None, t["last_used"] is not None) for t in tokens] == \
        [(1, True, True), (2, False, True)]
    listed = json.loads(spillway("tenant", "list", "--json", *state_args(state)).stdout)
    assert listed[0]["tokens"] == 0 and listed[0]["last_used"] is not None
    table = spillway("tenant", "list", *state_args(state)).stdout
    assert "last used" in table.splitlines()[0] and "ann" in table

    # a token without --keep-old replaces every other at once
    third = _token(state, "--expires-at", "2999-01-01")
    with server.client(third) as c:
        assert c.get("/jobs").status_code == 200


def test_expiry_errors_are_one_line(service):
    _, state, _ = service
    bad = spillway("tenant", "token", "ann", "--expires-in", "tomorrow", *state_args(state))
    assert bad.returncode == 2
    assert bad.stderr.strip() == ("spillway: error: expires-in: 'tomorrow' is not a duration such as 30d, "
                                  "12h, 90m or 2w")
    past = spillway("tenant", "add", "bob", "--expires-at", "2001-01-01", *state_args(state))
    assert past.returncode == 2 and past.stderr.strip() == \
        "spillway: error: expires-at: 2001-01-01T00:00:00+00:00 is not in the future"
    neither = spillway("tenant", "revoke-token", "ann", *state_args(state))
    assert neither.returncode == 2 and "give a token id or --old" in neither.stderr
