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


def test_the_client_talks_ucx_to_a_local_ucx_cluster_or_a_ucx_scheduler(tmp_path):
    import json

    from spillway.launch.plan import LaunchPlan
    from spillway.launch.session import _over_ucx
    from spillway.options.settings import Options

    options = Options.resolve()
    assert _over_ucx(LaunchPlan(kind="gpu", protocol="ucx"), options)
    assert not _over_ucx(LaunchPlan(kind="gpu", protocol="tcp"), options)
    assert not _over_ucx(LaunchPlan(kind="cpu", protocol="tcp"), options)
    attach = LaunchPlan(kind="attach")
    assert _over_ucx(attach, Options.resolve(scheduler_address="ucx://10.0.0.1:8786"))
    assert not _over_ucx(attach, Options.resolve(scheduler_address="tcp://10.0.0.1:8786"))
    for address, over in (("ucx://10.0.0.1:8786", True), ("tls://10.0.0.1:8786", False)):
        path = tmp_path / f"{over}.json"
        path.write_text(json.dumps({"address": address}))
        assert _over_ucx(attach, Options.resolve(scheduler_file=str(path))) is over


def _fake_ucxx(monkeypatch, seen: list):
    """distributed_ucxx.ucxx with an init_once that records the config it starts under."""
    import sys
    import types

    import dask.config

    package = types.ModuleType("distributed_ucxx")
    module = types.ModuleType("distributed_ucxx.ucxx")

    def init_once():
        seen.append({"environment": dask.config.get("distributed-ucxx.environment", default=None),
                     "create": dask.config.get("distributed-ucxx.create-cuda-context", default=None)})

    module.init_once = init_once
    package.ucxx = module
    monkeypatch.setitem(sys.modules, "distributed_ucxx", package)
    monkeypatch.setitem(sys.modules, "distributed_ucxx.ucxx", module)


def test_the_client_process_starts_ucx_without_cuda_ipc_and_leaves_the_config_as_it_was(monkeypatch):
    """The settings hold while UCX starts in this process and only then: the workers it
    starts after copy this process's config, and they keep CUDA IPC."""
    import dask.config

    from spillway.launch.ucx_env import CLIENT_UCX, start_client_ucx

    seen: list = []
    _fake_ucxx(monkeypatch, seen)
    with dask.config.set({"distributed-ucxx.environment": {"rndv-thresh": "8192"}}):
        start_client_ucx(gpu=True)
        start_client_ucx(gpu=False)
        after = dask.config.get("distributed-ucxx.environment")
        create = dask.config.get("distributed-ucxx.create-cuda-context", default=None)
    assert CLIENT_UCX == {"tls": "^cuda_ipc"}
    assert seen == [{"environment": {"rndv-thresh": "8192", "tls": "^cuda_ipc"}, "create": True},
                    {"environment": {"rndv-thresh": "8192", "tls": "^cuda_ipc"}, "create": None}]
    assert after == {"rndv-thresh": "8192"} and create is None

    # what the user set in distributed-ucxx's config is theirs
    seen.clear()
    with dask.config.set({"distributed-ucxx.environment": {"tls": "all"}, "distributed-ucxx.create-cuda-context": False}):
        start_client_ucx(gpu=True)
    assert seen == [{"environment": {"tls": "all"}, "create": False}]
