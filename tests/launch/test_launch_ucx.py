"""UCX's unused-variable warning is off in the processes spillway starts (ucxx sets
UCX_MEMTYPE_CACHE, which UCX 1.18 and later no longer read), unless the user set it."""

from __future__ import annotations

from spillway.launch.ucx_env import QUIET_UCX, quiet_ucx


def test_quiet_ucx_keeps_what_the_user_set():
    env = {}
    quiet_ucx(env)
    assert env == {"UCX_WARN_UNUSED_ENV_VARS": "n"} == QUIET_UCX
    env = {"UCX_WARN_UNUSED_ENV_VARS": "y"}
    quiet_ucx(env)
    assert env == {"UCX_WARN_UNUSED_ENV_VARS": "y"}


def test_attaching_a_client_quiets_ucx_for_this_process(monkeypatch):
    from distributed import LocalCluster

    from spillway.launch import open_cluster
    from spillway.options.settings import Options

    monkeypatch.delenv("UCX_WARN_UNUSED_ENV_VARS", raising=False)
    with LocalCluster(n_workers=1, processes=False, protocol="tcp", dashboard_address=None,
                      host="127.0.0.1") as cluster:
        with open_cluster(Options.resolve(scheduler_address=cluster.scheduler_address)) as session:
            assert session.n_workers == 1
    import os

    assert os.environ["UCX_WARN_UNUSED_ENV_VARS"] == "n"
