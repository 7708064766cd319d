"""A new cluster says where its start went: each step's seconds on the session and in one
log line."""

import logging
import time

from spillway.launch import open_cluster
from spillway.options.settings import Options


def test_a_cpu_cluster_times_each_step_of_its_start(caplog):
    caplog.set_level(logging.INFO, logger="spillway")
    began = time.perf_counter()
    with open_cluster(Options.resolve(cpu=True, n_workers=1, dashboard_address="")) as session:
        wall = time.perf_counter() - began
        steps = session.start_steps
        assert list(steps) == ["plan", "start", "client", "workers", "plugins", "data plane", "settle"], steps
        assert all(v >= 0 for v in steps.values()) and sum(steps.values()) <= wall
        assert session.client.submit(sum, [1, 2]).result(timeout=30) == 3
    (line,) = [r.getMessage() for r in caplog.records if "ready in" in r.getMessage()]
    assert line.startswith("1 CPU worker ready in ") and "data plane" in line and "start " in line, line


def test_a_gpu_cluster_tells_its_workers_it_is_ready_after_its_last_step(monkeypatch):
    from spillway.launch import session

    calls = []

    class FakeClient:
        def wait_for_workers(self, n, timeout):
            calls.append("wait")

        def run(self, fn, *args, **kwargs):
            calls.append(fn.__name__)
            return {"w0": "gpu"} if fn is session._worker_kind else {}

    monkeypatch.setattr(session, "register_plugins", lambda client, options: calls.append("plugins"))
    monkeypatch.setattr(session, "send_to_client", lambda client, workers, make: ["f"])
    monkeypatch.setattr(session, "received", lambda client, futures: calls.append("received"))
    monkeypatch.setattr(session, "_planes_ready", lambda client: calls.append("planes"))
    monkeypatch.setattr(session, "_settle", lambda client: calls.append("settle"))
    steps = {}
    assert session.setup_workers(FakeClient(), Options.resolve(), wait_for=1, steps=steps) == ("gpu", 1)
    assert calls[-1] == "_arena_may_grow" and calls.index("settle") < calls.index("_arena_may_grow")
    assert list(steps) == ["workers", "plugins", "data plane", "results path", "settle"]


def test_the_data_plane_registers_first_so_its_warm_up_runs_beside_the_other_plugins(monkeypatch):
    """The planes' warm-up (mapping each peer's pool, seconds a peer on H200s) starts when
    their plugin is set up: it is registered before the others, which then register while it
    runs."""
    from spillway.datapath.plane import DataPlanePlugin
    from spillway.launch import session
    from spillway.launch.plugins import WorkerSetup

    registered = []

    class FakeClient:
        class scheduler:
            address = "tcp://127.0.0.1:1"

        def register_plugin(self, plugin):
            registered.append(type(plugin).__name__)

        def run_on_scheduler(self, fn, *args):
            return None

    monkeypatch.setattr(session, "_exchange_in_bulk", lambda client, options: registered.append("collective"))
    session.register_plugins(FakeClient(), Options.resolve())
    assert registered[0] == DataPlanePlugin.__name__, registered
    assert registered.index(DataPlanePlugin.__name__) < registered.index(WorkerSetup.__name__)
    registered.clear()
    session.register_plugins(FakeClient(), Options.resolve(data_plane=False))
    assert DataPlanePlugin.__name__ not in registered and WorkerSetup.__name__ in registered
