"""Real workers over UCXX on a machine without GPUs (UCX's TCP transport): three worker
processes and a client, with the plugins a test needs (the data plane, the collective's
scheduler plugin). Skips where UCXX or distributed-ucxx is not installed (CI installs them
in a venv of its own)."""

from __future__ import annotations

import contextlib

import pytest


@contextlib.contextmanager
def ucx_workers(*plugins, n_workers: int = 3):
    pytest.importorskip("ucxx")
    pytest.importorskip("distributed_ucxx")
    from distributed import Client, LocalCluster

    with pytest.MonkeyPatch.context() as env:
        # the worker processes start from this environment
        env.setenv("UCX_TLS", "tcp")
        env.setenv("UCX_WARN_UNUSED_ENV_VARS", "n")
        with LocalCluster(n_workers=n_workers, threads_per_worker=1, protocol="ucx", host="127.0.0.1",
                          dashboard_address=None, processes=True) as cluster, Client(cluster) as client:
            client.wait_for_workers(n_workers, timeout=120)
            for plugin in plugins:
                client.register_plugin(plugin)
            yield client
