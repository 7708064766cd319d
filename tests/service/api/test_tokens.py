"""Token expiry and rotation through the real `spillway tenant` commands and a real
`spillway serve`: a rotation keeps the tenant working throughout, an expired token gets
401 with one line naming the expiry, and each token's last use is recorded. The service
resolves tokens from memory (issue 74): what `spillway tenant` changes while it serves (a
token revoked or issued, a tenant added or revoked) is seen within the bound
(:data:`~spillway.service.api.auth.MAX_AGE_S`)."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest
from serve_helpers import Server, add_tenant, spillway, state_args

from spillway.service.api.auth import MAX_AGE_S


def within_bound(predicate, what: str) -> float:
    """Seconds until ``predicate`` holds, after the command that changed the database
    returned: at most the bound (and a margin for a loaded machine's requests)."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < MAX_AGE_S + 1.0, f"not within {MAX_AGE_S} s: {what}"
        time.sleep(0.1)
    return time.monotonic() - start


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
    # during the rotation both tokens work (the new one once the service has read it)
    with server.client(first) as old, server.client(second) as new:
        took = within_bound(lambda: new.get("/jobs").status_code == 200, "the new token served")
        print(f"a token issued by `spillway tenant token --keep-old` served {took:.2f} s after the command")
        assert old.get("/jobs").status_code == 200
    out = spillway("tenant", "revoke-token", "ann", "--old", *state_args(state))
    assert out.returncode == 0 and out.stdout.strip() == "tenant ann: revoked token(s) 1", out.stdout
    with server.client(first) as old, server.client(second) as new:
        took = within_bound(lambda: old.get("/jobs").status_code == 401, "the revoked token refused")
        print(f"a token revoked by `spillway tenant revoke-token` refused {took:.2f} s after the command")
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
    with server.client(third) as c, server.client(second) as replaced:
        within_bound(lambda: c.get("/jobs").status_code == 200, "the new token served")
        within_bound(lambda: replaced.get("/jobs").status_code == 401, "the replaced token refused")


def test_a_tenant_added_or_revoked_while_serving(service):
    server, state, _ = service
    cleo = add_tenant(state, "cleo")
    with server.client(cleo) as c:
        took = within_bound(lambda: c.get("/jobs").status_code == 200, "a tenant added while serving")
        print(f"a tenant added by `spillway tenant add` served {took:.2f} s after the command")
        out = spillway("tenant", "revoke", "cleo", *state_args(state))
        assert out.returncode == 0, out.stderr
        took = within_bound(lambda: c.get("/jobs").status_code == 401, "a tenant revoked while serving")
        print(f"a tenant revoked by `spillway tenant revoke` refused {took:.2f} s after the command")
        r = c.get("/jobs")
        assert r.json()["detail"] == "invalid or revoked token" and r.headers["www-authenticate"] == "Bearer"


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
