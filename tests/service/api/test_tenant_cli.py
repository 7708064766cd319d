"""`spillway tenant add|list|revoke` and `spillway serve`'s early errors, through the real CLI."""

from __future__ import annotations

import json
import os

from serve_helpers import spillway

from spillway.service.jobdb import JobDB


def test_tenant_add_list_revoke(tmp_path):
    state = ["--state-dir", str(tmp_path)]
    out = spillway("tenant", "add", "alice", "--max-running", "3", "--max-job-bytes", "2GB", "--priority", "4",
                   *state)
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip().splitlines()[-1]
    assert token.startswith("spw_") and " " not in token
    assert "shown only now" in out.stdout

    listed = spillway("tenant", "list", "--json", *state)
    rows = json.loads(listed.stdout)
    assert [(r["name"], r["max_running"], r["max_job_bytes"], r["priority"], r["revoked"]) for r in rows] == \
        [("alice", 3, 2_000_000_000, 4, False)]
    assert token not in listed.stdout and "hash" not in listed.stdout
    assert token not in (tmp_path / "spillway.db").read_bytes().decode("latin-1")

    jobdb = JobDB.open(str(tmp_path))
    assert jobdb.tenant_for_token(token)["name"] == "alice"
    assert spillway("tenant", "revoke", "alice", *state).returncode == 0
    assert jobdb.tenant_for_token(token) is None
    jobdb.close()
    assert "revoked" in spillway("tenant", "list", *state).stdout


def test_tenant_errors_are_one_line(tmp_path):
    state = ["--state-dir", str(tmp_path)]
    assert spillway("tenant", "add", "bob", *state).returncode == 0
    again = spillway("tenant", "add", "bob", *state)
    assert again.returncode == 2 and again.stderr.strip() == "spillway: error: name: tenant 'bob' already exists"
    bad = spillway("tenant", "add", "carol", "--max-job-bytes", "lots", *state)
    assert bad.returncode == 2 and "max-job-bytes" in bad.stderr and "'lots'" in bad.stderr
    missing = spillway("tenant", "revoke", "nobody", *state)
    assert missing.returncode == 2 and missing.stderr.strip() == "spillway: error: name: no tenant 'nobody'"


def test_serve_refuses_bad_options_before_starting(tmp_path):
    state = ["--state-dir", str(tmp_path)]
    bad = spillway("serve", "--cpu", "--n-workers", "0", *state, timeout=60)
    assert bad.returncode == 2 and "n-workers: 0 must be >= 1" in bad.stderr
    # the scheduler the service starts always requires TLS (a certificate made at start)
    exposed = spillway("serve", "--cpu", *state, timeout=60, env={**os.environ, "DASK_SPILLWAY__SECURITY": "false"})
    assert exposed.returncode == 2 and "security: false (env DASK_SPILLWAY__SECURITY) is not for the service" \
        in exposed.stderr
    # a tenant's name is printable text: an escape sequence would reach the owner's terminal
    escape = spillway("tenant", "add", "eve\x1b[2J", *state)
    assert escape.returncode == 2 and "holds control characters" in escape.stderr
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    half = spillway("serve", "--cpu", "--https-cert", str(cert), *state, timeout=60)
    assert half.returncode == 2 and "--https-cert and --https-key go together" in half.stderr
    # --host is the HTTP address here; the scheduler keeps its configured (loopback) one
    helptext = spillway("serve", "--help").stdout
    assert "--host TEXT" in helptext and "Address the HTTP API listens on" in helptext
    assert "--scheduler-port" in helptext and "--rmm-pool-size" in helptext


def test_tenant_add_on_a_fresh_state_directory_keeps_it_private(tmp_path):
    """issue 63: `tenant add` before `serve` (the README's order) left the directory 0755
    and the database, which holds every tenant's token digests and jobs, 0644 with its
    -wal and -shm; whichever command makes them, they are the owner's alone."""
    import stat

    state = tmp_path / "fresh" / "state"
    old = os.umask(0o022)  # the common umask, which made them readable to all
    try:
        assert spillway("tenant", "add", "alice", "--state-dir", str(state)).returncode == 0
        assert spillway("tenant", "list", "--state-dir", str(state)).returncode == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    files = [p for p in state.iterdir() if p.name.startswith("spillway.db")]
    assert any(p.name == "spillway.db" for p in files), files
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # a database made open by an older version is closed up when next opened
    os.chmod(state / "spillway.db", 0o644)
    assert spillway("tenant", "list", "--state-dir", str(state)).returncode == 0
    assert stat.S_IMODE((state / "spillway.db").stat().st_mode) == 0o600


def _no_state_given(tmp_path) -> dict:
    """The environment of a user who names no state directory: its default under tmp_path."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPILLWAY_STATE_DIR", "SPILLWAY_DB")}
    env["XDG_STATE_HOME"] = str(tmp_path / "xdg")
    return env


def test_tenant_commands_make_no_state_by_surprise(tmp_path):
    """issue 75: `tenant list` with no --state-dir made an empty database at the default
    place, and a service served from another directory then showed an empty table."""
    env = _no_state_given(tmp_path)
    default = tmp_path / "xdg" / "spillway"
    for args in (("tenant", "list"), ("tenant", "add", "alice"), ("tenant", "revoke", "alice")):
        refused = spillway(*args, env=env)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.splitlines() == [
            f"spillway: error: state-dir: no service state at {str(default)!r} (the default: no --state-dir or "
            "SPILLWAY_STATE_DIR given); pass the --state-dir `spillway serve` uses, or `spillway tenant add NAME "
            "--create` to start one there"], refused.stderr
        assert not (tmp_path / "xdg").exists()
    # a directory named but never made is not made either, by any command but add
    named = spillway("tenant", "list", "--state-dir", str(tmp_path / "elsewhere"), env=env)
    assert named.returncode == 2 and "no service state at" in named.stderr and "(from --state-dir)" in named.stderr
    assert not (tmp_path / "elsewhere").exists()


def test_tenant_add_create_starts_the_default_state_and_every_command_names_it(tmp_path):
    env = _no_state_given(tmp_path)
    default = tmp_path / "xdg" / "spillway"
    made = spillway("tenant", "add", "alice", "--create", env=env)
    assert made.returncode == 0, made.stderr
    assert (default / "spillway.db").is_file()
    assert made.stderr.splitlines() == [f"spillway: state directory {default} (the default)"]
    listed = spillway("tenant", "list", "--json", env=env)
    assert [r["name"] for r in json.loads(listed.stdout)] == ["alice"]
    assert listed.stderr.splitlines() == [f"spillway: state directory {default} (the default)"]
    other = tmp_path / "other"
    assert spillway("tenant", "add", "bob", "--state-dir", str(other), env=env).returncode == 0
    named = spillway("tenant", "list", env={**env, "SPILLWAY_STATE_DIR": str(other)})
    assert named.stderr.splitlines() == [f"spillway: state directory {other} (SPILLWAY_STATE_DIR)"]
    assert "bob" in named.stdout and "alice" not in named.stdout
