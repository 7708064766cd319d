"""Which transport the workers use: the pure function over UCX settings, the reading on
real CPU workers, the run report and ``spillway info``, and on the GPU host CUDA IPC."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from spillway.datapath import transfer
from spillway.datapath.transfer import IPC, STAGED, cuda_ipc_enabled, describe, effective_tls


@pytest.mark.parametrize("tls, enabled", [
    ("tcp,cuda_copy,cuda_ipc", True),
    ("rc,tcp,cuda_copy", False),
    ("tcp", False),
    ("all", True),
    ("", True),
    ("cuda", True),
    ("^cuda_ipc", False),
    ("^rc,cuda", False),
    ("^rc,ud", True),
    (" TCP , CUDA_IPC ", True),
])
def test_cuda_ipc_from_ucx_tls(tls, enabled):
    assert cuda_ipc_enabled(tls) is enabled


def test_dask_cuda_nvlink_flag_gives_cuda_ipc():
    # what LocalCUDACluster(enable_nvlink=True) leaves in the workers' config
    config = {"distributed-ucxx": {"tcp": True, "nvlink": True, "infiniband": None, "cuda-copy": True}}
    assert effective_tls({}, config) == "tcp,cuda_copy,cuda_ipc"
    assert describe("ucx", {}, config) == IPC
    # enable_nvlink=False: dask-cuda turns TCP and InfiniBand on instead
    off = {"distributed-ucxx": {"tcp": True, "nvlink": False, "infiniband": True, "cuda-copy": True}}
    assert effective_tls({}, off) == "rc,tcp,cuda_copy"
    assert describe("ucx", {}, off) == STAGED


def test_precedence_context_then_environment_then_config():
    config = {"distributed-ucxx": {"tcp": True, "nvlink": True}}
    assert describe("ucx", {"UCX_TLS": "tcp,cuda_copy"}, config) == STAGED
    assert describe("ucx", {"UCX_TLS": "tcp,cuda_copy"}, config, context={"TLS": "all"}) == IPC
    assert describe("ucxx", {}, {"distributed.comm.ucx": {"nvlink": True, "tcp": True}}) == IPC  # legacy
    assert describe("ucx", {}, {"distributed-ucxx": {"environment": {"tls": "tcp,cuda_copy"}}}) == STAGED
    assert describe("ucx", {}, {}) == IPC  # nothing set: UCX's default is every transport


@pytest.mark.parametrize("address, label", [
    ("tcp://127.0.0.1:4000", "tcp"),
    ("tls://10.0.0.1:4000", "tcp (TLS)"),
    ("inproc://10.0.0.1/1/2", "inproc"),
    ("ucx://127.0.0.1:4000", IPC),
])
def test_protocols(address, label):
    assert describe(address) == label


def test_planned_transport_follows_the_nvlink_option():
    assert transfer.planned("ucx", True) == IPC
    assert transfer.planned("ucx", False) == STAGED
    assert transfer.planned("ucx", True, {"UCX_TLS": "tcp,cuda_copy"}) == STAGED
    assert transfer.planned("tcp", True) == "tcp"


def test_read_on_real_cpu_workers_and_in_the_run_report():
    from distributed import Client, LocalCluster

    from spillway.launch import open_cluster
    from spillway.options.settings import Options
    from spillway.run.compute import run_workflow
    from spillway.run.text import format_report

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, protocol="tcp", host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        settings = client.run(transfer.worker_settings)
        assert len(settings) == 2
        for s in settings.values():
            assert s["protocol"] == "tcp" and s["context"] is None
            assert set(s["config"]) == set(transfer.NAMESPACES)
        assert transfer.transport(client) == "tcp"

    options = Options.resolve(cpu=True, n_workers=2, dashboard_address="")
    with open_cluster(options) as session:
        report = run_workflow(session, "transpose-sum", {"size": "400x400", "chunks": "100x100"})
    assert report["transport"] == "tcp"
    assert "between workers" in format_report(report) and " over tcp" in format_report(report)


def test_info_says_the_planned_transport():
    from spillway.cli import main

    result = CliRunner().invoke(main, ["info", "--json"], catch_exceptions=False)
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["transport"]
    if not data["gpus"]:
        assert data["transport"] == "tcp"
        text = CliRunner().invoke(main, ["info"]).stdout
        assert "transport between workers: tcp" in text


@pytest.mark.gpu
def test_cuda_ipc_is_reported_between_two_gpus(gpu_count):
    if gpu_count < 2:
        pytest.skip("needs two GPUs")
    from spillway.cli import main
    from spillway.launch import open_cluster
    from spillway.options.settings import Options
    from spillway.run.compute import run_workflow

    with open_cluster(Options.resolve(protocol="ucx", rmm_pool_size="4GB", dashboard_address="",
                                      devices="0,1")) as session:
        settings = session.client.run(transfer.worker_settings)
        assert transfer.transport(session.client) == IPC, settings
        report = run_workflow(session, "transpose-sum", {"size": "20000x20000", "chunks": "5000x5000"})
    assert report["transport"] == IPC and "CUDA IPC" in report["transport"]
    assert report["bytes_transferred"] > 0
    info = json.loads(CliRunner().invoke(main, ["info", "--json"]).stdout)
    assert "CUDA IPC" in info["transport"]
