"""Failing safe: each seam of spillway/upstream.py replaced with a wrong shape (a
function of another signature, a result of another type, a class or attribute gone), and
the graph still runs, without the feature the seam serves, said once in the log.

The seams the scheduler and the workers use on every graph run a real graph on an
in-process cluster with spillway's scheduler and worker plugins and the tiered store; the
others show their adapter's fallback directly.
"""

from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster
from numpy_codec import NumpyCodec

from spillway import upstream
from spillway.memory.capacity import PLUGIN_NAME, CapacityPlugin
from spillway.launch.session import _heartbeat
from spillway.memory.store import TieredStore
from spillway.launch.plugins import WorkerSetup

MB = 2**20
pytestmark = pytest.mark.filterwarnings("ignore:Sending large graph")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    import distributed.scheduler as ds

    from spillway.memory import graph_bytes

    # a scheduler of an earlier test in this process that closed without its plugins'
    # close (a loaded machine's timeout) leaves graph materialization wrapped: these tests
    # swap distributed's own function, and must see that, not a wrapper sizing graphs
    # behind them; keys sized earlier would spare a graph the seams the tests take away
    current = ds._materialize_graph
    while getattr(current, "_spillway_sizes", False):
        current = current._spillway_original
    monkeypatch.setattr(ds, "_materialize_graph", current)
    graph_bytes._known.clear()
    upstream.reset()
    yield
    upstream.reset()


@contextlib.contextmanager
def cluster():
    store = TieredStore(device_limit=4 * MB, host_limit=4 * MB, codec=NumpyCodec())
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=None,
                      data=store) as c, Client(c) as client:
        client.register_plugin(CapacityPlugin())
        client.register_plugin(WorkerSetup(prefetch=True))
        client.run(_heartbeat)
        yield client


def runs(client) -> None:
    """A graph that spills (12 MiB through 8 MiB of tiers) and a rechunk: right values."""
    values = np.random.default_rng(0).random((1200, 1200))
    x = da.from_array(values, chunks=(300, 1200))
    y = x.rechunk((1200, 300)) + 1
    total, col = dask.compute(y.sum(), y[:, 5])
    assert total == pytest.approx(values.sum() + values.size)
    np.testing.assert_array_equal(col, values[:, 5] + 1)


def said(caplog, name: str) -> int:
    seam = upstream.SEAMS[name]
    return sum(1 for r in caplog.records if r.name == "spillway.upstream" and seam.serves in r.getMessage())


def sized(client) -> bool:
    """Whether the capacity check saw sizes for the last graph (it counts what it holds)."""
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins[PLUGIN_NAME]._sizes)


# --- on every graph: the capacity check's seams


def test_a_materialization_of_another_signature_leaves_graphs_unchecked_and_running(monkeypatch, caplog):
    import distributed.scheduler as ds

    original = ds._materialize_graph

    def other(*args, **kwargs):  # no parameter named expr
        return original(*args, **kwargs)

    monkeypatch.setattr(ds, "_materialize_graph", other)
    with caplog.at_level(logging.WARNING, "spillway.upstream"), cluster() as client:
        assert not sized(client)
        runs(client)
        runs(client)
    assert ds._materialize_graph is other
    assert said(caplog, "materialize_graph") == 1


def test_a_materialization_returning_another_shape_is_handed_back_as_it_came(monkeypatch, caplog):
    import distributed.scheduler as ds

    original = ds._materialize_graph

    def listed(expr, validate):  # a list where a tuple was: distributed unpacks it all the same
        return list(original(expr=expr, validate=validate))

    monkeypatch.setattr(ds, "_materialize_graph", listed)
    with caplog.at_level(logging.WARNING, "spillway.upstream"), cluster() as client:
        assert sized(client)  # wrapped: the shape is only seen when a graph comes
        runs(client)
        runs(client)
    assert said(caplog, "materialize_graph") == 1


def test_sizes_that_cannot_be_read_leave_the_graph_unchecked(monkeypatch):
    from spillway.memory import capacity

    def broken(expr, dsk):
        raise TypeError("an expression of a shape not known")

    monkeypatch.setattr(capacity, "graph_bytes", broken)
    with cluster() as client:
        runs(client)


@pytest.mark.parametrize("seam", ["dask_expressions", "dask_task_spec"])
def test_dask_without_its_expression_or_task_classes_runs_unchecked(monkeypatch, caplog, seam):
    # dask itself imports these classes by name at run time: a dask without them is
    # stood for by the seam's check finding them missing
    import dataclasses

    monkeypatch.setitem(upstream.SEAMS, seam, dataclasses.replace(upstream.SEAMS[seam], check=lambda: "has no class"))
    with caplog.at_level(logging.WARNING, "spillway.upstream"), cluster() as client:
        runs(client)
        runs(client)
    assert said(caplog, seam) == 1


def test_sizes_read_with_the_real_dask_are_unchanged_by_the_fallbacks():
    from dask.base import collections_to_expr

    from spillway.memory.graph_bytes import chunk_layers

    expr = collections_to_expr([da.ones((4, 4), chunks=2)], True)
    assert set(chunk_layers(expr).values()) == {(((2, 2), (2, 2)), 8)}


# --- on the workers


def test_a_worker_queue_without_peekn_prefetches_nothing_and_runs(monkeypatch, caplog):
    from distributed.collections import HeapSet

    monkeypatch.delattr(HeapSet, "peekn")
    with caplog.at_level(logging.WARNING, "spillway.upstream"), cluster() as client:
        runs(client)
        client.run(lambda dask_worker: upstream.queued_tasks(dask_worker.state, 8))
    assert said(caplog, "worker_queue") == 1


def test_a_queue_changed_while_read_reads_as_empty_for_that_look():
    class Changing:
        def peekn(self, n):
            raise RuntimeError("Set changed size during iteration")

    assert upstream.queued_tasks(SimpleNamespace(ready=Changing(), constrained=Changing()), 8) == []
    assert not upstream.said_off()  # not a wrong shape: the next look reads it


def test_workers_of_the_process_unknown_mean_the_arena_grows_as_before(monkeypatch, caplog):
    from distributed import Worker

    from spillway.memory.worker import _worker_closing

    monkeypatch.delattr(Worker, "_instances")
    with caplog.at_level(logging.WARNING, "spillway.upstream"):
        assert not _worker_closing()
    assert said(caplog, "worker_instances") == 1


def test_zict_buffers_without_callbacks_count_no_spills_and_fail_nothing():
    plugin = WorkerSetup()
    data = SimpleNamespace(device_buffer=SimpleNamespace(fast_to_slow_callbacks=None), host_buffer=object())
    plugin._count_spills(data)
    assert plugin.spilled == {"device_to_host": 0, "host_to_disk": 0, "host_to_device": 0, "disk_to_host": 0}


def test_an_offload_threshold_gone_leaves_distributeds_default(monkeypatch, caplog):
    from distributed.comm import utils

    from spillway.launch.worker_config import follow_offload_config

    monkeypatch.delattr(utils, "OFFLOAD_THRESHOLD")
    with caplog.at_level(logging.WARNING, "spillway.upstream"):
        assert follow_offload_config() is None
    assert said(caplog, "offload_threshold") == 1


def test_outgoing_transfer_books_gone_let_the_plane_serve_uncounted(caplog):
    worker = SimpleNamespace(address="ucx://10.0.0.1:1", status=SimpleNamespace(name="running"))
    with caplog.at_level(logging.WARNING, "spillway.upstream"):
        assert not upstream.outgoing_at_limit(worker, "ucx://10.0.0.2:1")
        upstream.outgoing_started(worker)
        upstream.outgoing_bytes(worker, 10)
        upstream.outgoing_finished(worker, {})
    assert said(caplog, "transfer_outgoing") == 1


# --- the data plane's hook


def test_a_gather_function_of_another_signature_leaves_the_plane_off(monkeypatch, caplog):
    import asyncio

    import distributed.worker

    from spillway.datapath.plane import hook
    from spillway.datapath.plane.plugin import DataPlanePlugin

    async def other(rpc, keys, worker):  # no who=: the plane could not tell who asks
        return {"status": "OK", "data": {}}

    monkeypatch.setattr(distributed.worker, "get_data_from_worker", other)
    monkeypatch.setattr(hook, "_original", None)
    plugin = DataPlanePlugin()
    worker = SimpleNamespace(address="ucx://10.0.0.1:1", handlers={}, plugins={hook.PLUGIN_NAME: plugin})
    with caplog.at_level(logging.WARNING, "spillway.upstream"):
        asyncio.run(plugin.setup(worker))
    assert hook.plane_of(worker) is None and "dataplane_contact" not in worker.handlers
    assert distributed.worker.get_data_from_worker is other  # distributed's gathers as they were
    assert said(caplog, "get_data_from_worker") == 1


# --- the scheduler's erred keys, the cluster managers


def test_keys_failed_on_a_scheduler_of_another_shape_are_still_released(caplog):
    released = []

    def report(*args, **kwargs):
        raise TypeError("report() takes other arguments")

    scheduler = SimpleNamespace(report=report, clients={}, tasks={},
                                client_releases_keys=lambda keys, client, stimulus_id: released.append(keys),
                                loop=SimpleNamespace(add_callback=lambda f, *a: f(*a)))
    with caplog.at_level(logging.WARNING, "spillway.upstream"):
        upstream.fail_keys(scheduler, "c", ["k"], ValueError("full"), "s")
    assert released == [["k"]]
    assert said(caplog, "scheduler_fail_keys") == 1


def test_a_cluster_without_scale_down_scales_by_count(caplog):
    asked = []
    cluster = SimpleNamespace(worker_spec={"a": 1, "b": 2, "c": 3}, scale=asked.append)
    with caplog.at_level(logging.WARNING, "spillway.upstream"):
        upstream.close_spec_workers(cluster, ["b"])
    assert asked == [2]
    assert upstream.new_worker_options(SimpleNamespace()) is None
    assert upstream.adaptive_of(SimpleNamespace()) is None
    upstream.end_adapting(SimpleNamespace())


def test_a_nanny_whose_background_tasks_were_renamed_still_tells_the_death_reason(monkeypatch, caplog):
    """Where distributed renamed the nanny's task group, the reason is told from its event
    loop, and the log says the seam is off (it is not swallowed)."""
    from distributed.core import AsyncTaskGroup, Server

    told = []
    nanny = SimpleNamespace(loop=SimpleNamespace(add_callback=lambda f, *a: told.append((f, a))))

    async def tell(event):
        pass

    monkeypatch.setattr(Server, "__init__", lambda self: None)  # no task group made there any more
    with caplog.at_level(logging.WARNING, "spillway.upstream"):
        assert upstream.call_soon_on(nanny, tell, {"reason": "killed"})
    assert told == [(tell, ({"reason": "killed"},))]
    assert said(caplog, "nanny_background_tasks") == 1

    monkeypatch.undo()
    upstream.reset()
    group = AsyncTaskGroup()
    group.close()  # a nanny closing: the task would be cancelled at once
    assert not upstream.call_soon_on(SimpleNamespace(_ongoing_background_tasks=group), tell, {})


def test_a_spec_cluster_without_its_correct_state_step_scales_without_waiting(monkeypatch, caplog):
    from distributed.deploy.spec import SpecCluster

    monkeypatch.delattr(SpecCluster, "_correct_state")
    synced = []
    with caplog.at_level(logging.WARNING, "spillway.upstream"):
        upstream.bring_to_spec(SimpleNamespace(sync=synced.append))
    assert synced == [] and said(caplog, "spec_correct_state") == 1


def test_a_cluster_class_that_starts_otherwise_keeps_its_dashboard(monkeypatch, caplog):
    from distributed.deploy.spec import SpecCluster

    def start(self):  # not a coroutine function
        return None

    monkeypatch.setattr(SpecCluster, "_start", start)
    with caplog.at_level(logging.WARNING, "spillway.upstream"):
        assert upstream.with_scheduler_class(SpecCluster, lambda: object) is SpecCluster
    assert said(caplog, "spec_cluster_start") == 1


def test_a_spec_cluster_that_handles_lost_workers_otherwise_is_left_as_it_is(monkeypatch, caplog):
    from distributed.deploy.spec import SpecCluster

    def other(self, op, msg):  # reads no lost-worker-timeout
        return None

    monkeypatch.setattr(SpecCluster, "_update_worker_status", other)
    upstream._keeping.clear()
    with caplog.at_level(logging.WARNING, "spillway.upstream"):
        assert upstream.keeping_restarted_workers(SpecCluster) is SpecCluster
    assert said(caplog, "spec_cluster_lost_worker") == 1
    upstream._keeping.clear()


def _lost(nanny_status, process_status):
    """A worker of a cluster kept by :func:`upstream.keeping_restarted_workers` removed by
    the scheduler, its nanny in the states given; what is left of the cluster's workers
    once three of distributed's lost-worker-timeouts have passed."""
    import asyncio

    import dask.config
    from distributed.core import Status
    from distributed.deploy.spec import SpecCluster

    closed = []

    class Nanny:
        status = nanny_status
        process = None if process_status is None else SimpleNamespace(status=process_status)

        async def close(self):
            closed.append(self)

    cls = upstream.keeping_restarted_workers(SpecCluster)
    cluster = cls.__new__(cls)  # the method reads these of a SpecCluster only
    cluster.workers = {"a": Nanny()}
    cluster.scheduler_info = {"workers": {"tcp://127.0.0.1:1": {"name": "a"}}}
    cluster._futures = set()
    cluster.status = Status.running

    async def main():
        cluster._update_worker_status("remove", "tcp://127.0.0.1:1")
        await asyncio.sleep(0.15)
        await asyncio.gather(*cluster._futures)

    with dask.config.set({"distributed.deploy.lost-worker-timeout": "0.04s"}):
        asyncio.run(main())
    assert cluster.scheduler_info["workers"] == {}
    return set(cluster.workers), len(closed)


def test_a_nanny_bringing_its_worker_back_is_kept_and_one_that_gave_up_is_closed():
    from distributed.core import Status

    assert _lost(Status.running, Status.starting) == ({"a"}, 0)
    assert _lost(Status.running, Status.running) == ({"a"}, 0)
    assert _lost(Status.running, Status.failed) == (set(), 1)  # its restart failed
    assert _lost(Status.running, None) == (set(), 1)  # no process: nothing coming back
    assert _lost(Status.closed, Status.stopped) == (set(), 1)


def test_ucxx_absent_gives_an_error_class_nothing_raises(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ucxx", None)
    error = upstream.ucx_error()
    assert not issubclass(ValueError, error) and issubclass(error, object)


def test_an_upstream_installed_without_its_source_keeps_its_features_on(monkeypatch):
    import inspect

    def no_source(obj):
        raise OSError("could not get source code")

    monkeypatch.setattr(inspect, "getsource", no_source)
    assert upstream.usable("get_data_from_worker") and upstream.usable("spec_cluster_start")
    assert not upstream.said_off()


def test_a_job_without_distributeds_lock_still_starts_once(caplog):
    import asyncio

    from distributed.core import Status
    from distributed.deploy.spec import ProcessInterface

    class Job(ProcessInterface):
        starts = 0

        def __init__(self):
            super().__init__()
            del self.lock  # a distributed that keeps none

        async def start(self):
            Job.starts += 1
            await asyncio.sleep(0.01)
            self.status = Status.failed

        def __await__(self):
            return upstream.start_once(self)

    async def main():
        job = Job()
        return job, await asyncio.gather(job, job)

    job, awaited = asyncio.run(main())
    assert awaited == [job, job] and Job.starts == 1 and job.status == Status.failed
    assert said(caplog, "process_interface_start") == 1


def test_zarr_of_another_buffer_shape_keeps_its_own_buffer_and_says_so(monkeypatch, caplog):
    import dataclasses

    import zarr

    from spillway.memory import zarr_buffer

    before = zarr.config.get("ndbuffer")
    monkeypatch.setitem(upstream.SEAMS, "zarr_host_ndbuffer",
                        dataclasses.replace(upstream.SEAMS["zarr_host_ndbuffer"],
                                            check=lambda: "zarr.registry.register_ndbuffer is gone"))
    upstream.reset()
    try:
        with caplog.at_level("WARNING", logger="spillway.upstream"):
            zarr_buffer.install()
        assert not zarr_buffer.installed() and zarr.config.get("ndbuffer") == before
        assert "users' own zarr writes of device chunks on GPU workers is off" in caplog.text
    finally:
        monkeypatch.undo()
        upstream.reset()
    # with zarr as it is, the buffer is taken
    with zarr.config.set({"ndbuffer": before}):
        zarr_buffer.install()
        assert zarr_buffer.installed()
