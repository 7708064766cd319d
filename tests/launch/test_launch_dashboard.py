"""The dashboard off means no HTTP server at all: distributed's scheduler otherwise listens on
8787 (or the next free port) with ``dashboard_address=None``. A dashboard asked for by port
alone listens on the cluster's host, not on every interface; one on a port another process
holds moves to a free port without distributed's warning."""

from __future__ import annotations

import functools
import os
import socket
import warnings

import httpx
import psutil
import pytest

from spillway.launch import open_cluster
from spillway.launch import http_server
from spillway.launch.http_server import free_dashboard_address, http_server_off
from spillway.launch.plan import plan
from spillway.options.settings import Options
from stand_ins import gpu_cluster_kwargs, h200_host, host_probe

inventory = functools.partial(h200_host, links=18)


def _listening(pid: int) -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN}


@pytest.mark.parametrize("off", ["", None])
def test_gpu_cluster_keywords_turn_the_http_server_off(off):
    opts = Options.resolve(dashboard_address=off)
    kw = gpu_cluster_kwargs(opts, plan(opts, inventory(2), host=host_probe(have_ucxx=True, have_cuda_stack=True)))
    assert kw["dashboard_address"] is None
    assert kw["scheduler_kwargs"] == {"dashboard": False}
    assert http_server_off(kw)


def test_gpu_cluster_keywords_keep_a_port_alone_on_the_cluster_host(monkeypatch):
    monkeypatch.setattr(http_server, "port_free", lambda host, port: True)  # whoever holds 8790 here
    opts = Options.resolve(dashboard_address=":8790")
    kw = gpu_cluster_kwargs(opts, plan(opts, inventory(2), host=host_probe(have_ucxx=True, have_cuda_stack=True)))
    assert kw["dashboard_address"] == "127.0.0.1:8790" and "scheduler_kwargs" not in kw
    assert not http_server_off(kw)
    opts = Options.resolve(dashboard_address="10.0.0.5:8790")
    kw = gpu_cluster_kwargs(opts, plan(opts, inventory(2), host=host_probe(have_ucxx=True, have_cuda_stack=True)))
    assert kw["dashboard_address"] == "10.0.0.5:8790"


def test_cpu_cluster_with_the_dashboard_off_serves_no_http():
    before = _listening(os.getpid())
    with open_cluster(Options.resolve(cpu=True, n_workers=1, dashboard_address="")) as session:
        info = session.client.scheduler_info()
        assert "dashboard" not in info["services"], info["services"]
        assert session.dashboard_link in (None, "")
        ours = {int(session.scheduler_address.rsplit(":", 1)[1])}
        ours |= {int(w["nanny"].rsplit(":", 1)[1]) for w in info["workers"].values()}
        # the scheduler and the nannies run in this process: their comm ports are all
        # that it listens on now, 8787 (distributed's pick) or any other HTTP port not among them
        new = {port for _, port in _listening(os.getpid()) - before}
        assert new == ours, (new, ours)
        assert session.client.submit(sum, [1, 2]).result(timeout=30) == 3


def test_cpu_cluster_dashboard_by_port_listens_on_the_cluster_host():
    before = _listening(os.getpid())
    with open_cluster(Options.resolve(cpu=True, n_workers=1, dashboard_address=":0")) as session:
        port = session.client.scheduler_info()["services"]["dashboard"]
        new = _listening(os.getpid()) - before
        assert ("127.0.0.1", port) in new and ("0.0.0.0", port) not in new, new
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).text == "ok"


@pytest.fixture
def held_port():
    """A port another listener holds on loopback, as a second cluster holds 8787."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_held_dashboard_port_becomes_a_free_one(held_port):
    assert free_dashboard_address(f"127.0.0.1:{held_port}") == "127.0.0.1:0"
    assert free_dashboard_address("127.0.0.1:0") == "127.0.0.1:0"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert free_dashboard_address(f"127.0.0.1:{free}") == f"127.0.0.1:{free}"


def test_a_cluster_whose_dashboard_port_is_held_starts_without_a_warning(held_port, caplog):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with open_cluster(Options.resolve(cpu=True, n_workers=1, dashboard_address=f"127.0.0.1:{held_port}")) as s:
            port = s.client.scheduler_info()["services"]["dashboard"]
            assert port != held_port and str(port) in s.dashboard_link
            assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).text == "ok"
    said = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    assert not [line for line in said if "already in use" in line], said
