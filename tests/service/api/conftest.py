"""Fixtures of the service tests: a throwaway PostgreSQL server and per-backend state."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import sys

import pytest

# The tests import with --import-mode=importlib, which puts no test folder on sys.path;
# the helper module next to this file is shared by this folder's tests.
sys.path.insert(0, str(Path(__file__).parent))

from serve_helpers import free_port, new_database, pg_bin  # noqa: E402


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server on 127.0.0.1 in a temporary directory; yields a base URL."""
    initdb, pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL server binaries not installed (.ci/setup.d/postgres.sh installs them)")
    root = Path(tempfile.mkdtemp(prefix="spillway-pg-"))
    data = root / "data"
    port = free_port()
    run_as: list[str] = []
    if os.geteuid() == 0:
        # the server refuses to run as root: run it as the postgres system user
        import pwd

        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*run_as, initdb, "-D", str(data), "-A", "trust", "-U", "spillway", "--no-sync"],
                   check=True, capture_output=True, timeout=120)
    subprocess.run([*run_as, pg_ctl, "-D", str(data), "-l", str(root / "log"), "-w", "-t", "60",
                    "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
                   check=True, capture_output=True, timeout=90)
    try:
        yield f"postgresql://spillway@127.0.0.1:{port}"
    finally:
        subprocess.run([*run_as, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_state(request, tmp_path):
    """State (directory and database URL) for each backend."""
    state = {"state_dir": str(tmp_path / "state")}
    if request.param == "postgresql":
        state["db"] = new_database(request.getfixturevalue("postgres_server"))
    state["backend"] = request.param
    return state


