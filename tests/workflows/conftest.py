"""One real CPU cluster (two worker processes on 127.0.0.1) shared by the workflow tests."""

from __future__ import annotations

import pytest

from spillway.launch import open_cluster
from spillway.options.settings import Options


@pytest.fixture(scope="session")
def cpu_session():
    options = Options.resolve(cpu=True, n_workers=2, threads_per_worker=1, host="127.0.0.1",
                              dashboard_address=None, memory_limit="3GB", protocol="tcp")
    with open_cluster(options) as session:
        yield session
