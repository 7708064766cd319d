"""Fixtures of the service tests: a throwaway PostgreSQL server and per-backend state."""

from __future__ import annotations

import shutil
from pathlib import Path

import sys

import pytest

# The tests import with --import-mode=importlib, which puts no test folder on sys.path;
# the helper module next to this file is shared by this folder's tests.
sys.path.insert(0, str(Path(__file__).parent))

from serve_helpers import PostgresServer, new_database, temp_dir_others_reach  # noqa: E402


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server on 127.0.0.1 in a temporary directory; yields a base URL."""
    server = PostgresServer(temp_dir_others_reach("spillway-pg-"))
    if not server.available:
        pytest.skip("PostgreSQL server binaries not installed (.ci/setup.d/postgres.sh installs them)")
    server.init()
    try:
        yield server.url
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_state(request, tmp_path):
    """State (directory and database URL) for each backend."""
    state = {"state_dir": str(tmp_path / "state")}
    if request.param == "postgresql":
        state["db"] = new_database(request.getfixturevalue("postgres_server"))
    state["backend"] = request.param
    return state


@pytest.fixture
def jobdb(db_state):
    from spillway.service.jobdb import JobDB

    s = JobDB.open(db_state["state_dir"], db_state.get("db"))
    yield s
    s.close()
