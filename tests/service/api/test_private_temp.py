"""Every directory `spillway serve` and its cluster write is the service's own (issue 74):
distributed opens ``global.lock`` and ``purge.lock`` in its workspace with
``open(path, "wb")``, following links, and the scheduler's workspace was
``$TMPDIR/dask-scratch-space``, which another local user can make first. Links planted
there (to the owner's files) are now never opened: the scheduler's, nannies' and workers'
workspaces and temporary files are under the 0700 state directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from serve_helpers import Server, add_tenant, postgres_if_installed, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_links_planted_in_the_shared_scratch_space_are_never_followed(request, tmp_path, monkeypatch):
    shared = tmp_path / "shared-tmp"  # the TMPDIR every local user writes in
    trap = shared / "dask-scratch-space"
    trap.mkdir(parents=True)
    state = {"state_dir": str(tmp_path / "state")}
    postgres_if_installed(request, state)
    add_tenant(state, "ann")
    token = add_tenant(state, "bob")
    owners = tmp_path / "important.txt"
    owners.write_bytes(b"the owner's bytes")
    # on SQLite the job database itself, the first victim
    sqlite = None if state.get("db") else Path(state["state_dir"]) / "spillway.db"
    os.symlink(sqlite or owners, trap / "global.lock")
    os.symlink(owners, trap / "purge.lock")
    db_size = sqlite.stat().st_size if sqlite else None
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.delenv("DASK_TEMPORARY_DIRECTORY", raising=False)
    server = Server(state, "--cpu", "--n-workers", "2", "--threads-per-worker", "1").start()
    try:
        with server.client(token) as c:
            r = c.post("/jobs", json={"workflow": "transpose-sum", "params": {"size": "200x200"}})
            assert r.status_code == 201, r.text
            assert wait_state(c, r.json()["id"], {"done", "failed"}, timeout=120)["state"] == "done"
            assert c.get("/healthz").status_code == 200  # still serving, the database intact
        # the scheduler's and the workers' workspaces, with their locks, under the state directory
        workspace = Path(state["state_dir"]) / "scratch" / "dask-scratch-space"
        kinds = {p.name.split("-")[0].removeprefix("quiet") for p in workspace.iterdir() if p.is_dir()}
        assert {"scheduler", "worker"} <= kinds, kinds
        assert (workspace / "global.lock").is_file() and not (workspace / "global.lock").is_symlink()
        assert server.proc.poll() is None
    finally:
        server.stop()
    assert owners.read_bytes() == b"the owner's bytes"
    if sqlite:
        assert sqlite.stat().st_size >= db_size > 0
    assert sorted(p.name for p in trap.iterdir()) == sorted(p.name for p in trap.iterdir() if p.is_symlink())
    assert not [p for p in shared.iterdir() if p != trap], list(shared.iterdir())  # nothing else written there
    root = Path(state["state_dir"])
    for sub in ("tmp", "scratch"):
        st = os.lstat(root / sub)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700, (sub, oct(st.st_mode))


def test_a_scratch_directory_that_is_a_link_is_refused(tmp_path):
    from serve_helpers import spillway

    state = tmp_path / "state"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state.mkdir(mode=0o700)
    os.symlink(elsewhere, state / "tmp")
    out = spillway("serve", "--state-dir", str(state), "--cpu", "--n-workers", "1", "--port", "0", timeout=120)
    assert out.returncode != 0
    line = out.stderr.strip().splitlines()[-1]
    assert f"state-dir: cannot use {str(state / 'tmp')!r}" in line, out.stderr
    assert not list(elsewhere.iterdir())


def test_serve_in_this_process_puts_the_temporary_directories_back(tmp_path, monkeypatch):
    # a caller in the process (a test, a notebook) keeps its own after the command ends:
    # a port in use ends it at once, after the private directories were set
    import socket
    import tempfile

    import dask
    from click.testing import CliRunner

    from spillway.cli import main

    monkeypatch.setenv("TMPDIR", str(tmp_path / "mine"))
    (tmp_path / "mine").mkdir()
    before = (tempfile.tempdir, dask.config.get("temporary-directory", None))
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    try:
        result = CliRunner().invoke(main, ["serve", "--cpu", "--state-dir", str(tmp_path / "state"),
                                           "--port", str(port)])
    finally:
        taken.close()
    assert result.exit_code != 0 and "port" in result.output, result.output
    assert (tmp_path / "state" / "tmp").is_dir()  # it had set them
    assert os.environ["TMPDIR"] == str(tmp_path / "mine")
    assert (tempfile.tempdir, dask.config.get("temporary-directory", None)) == before
