"""A pytest plugin that runs dask's own CuPy array tests on a cluster, so that every
value those tests compute passes through a worker's store.

    PYTHONPATH=tests/conformance:$PYTHONPATH python -m pytest -p dask_cupy_conformance \
        --conformance=tiered-host --pyargs dask.array.tests.test_cupy_core ...

``--conformance`` picks the cluster:

* ``tiered-host``: spillway's local cluster with a 1 MB device limit, so nearly every
  value leaves the device for host memory and comes back for the next task;
* ``tiered-disk``: the same with a host tier that holds nothing, so values go on to disk
  (the store's host limit is set to 0 on the running workers: distributed's own
  ``memory_limit`` stays, since its scheduler refuses tasks whose inputs pass it);
* ``dask-cuda``: plain dask-cuda (``LocalCUDACluster`` and its own device -> host store)
  with the same 1 MB device limit: the control. A test that fails here too fails for a
  reason of the distributed scheduler, not of spillway's store.

The cluster is started once per session and made dask's default scheduler, dask's
``assert_eq`` computing there too (it computes with ``scheduler="sync"`` unless told
otherwise, and most of these tests check their values through it alone: without this
they would pass without a task reaching the store); a test that names its own scheduler
keeps it. The tasks the scheduler ran for each test are counted: each test's count is in
its report's ``user_properties`` (``tasks``), and the session ends with the total and the
tests that ran none (``--conformance-tasks PATH`` writes them all as JSON).

After each test the plugin waits until the scheduler has forgotten every key, so each
test starts on an empty cluster as it would on dask's
local scheduler: ``test_tsqr_uncertain`` names its arrays ``"A"``, ``"c"`` and ``"r"``
in every case with new random values, and a key of the previous case that the scheduler
has not yet released is taken as already computed (plain dask-cuda failed 6 of those
cases without the wait). ``--conformance-keep-keys`` turns the wait off.
"""

from __future__ import annotations

import json

import pytest

from on_cluster import assert_eq_on_cluster, count_tasks, one_test

CHOICES = ("tiered-host", "tiered-disk", "dask-cuda")
DEVICE_LIMIT = "1MB"


def pytest_addoption(parser):
    parser.addoption("--conformance", choices=CHOICES, default="tiered-host",
                     help="the cluster dask's CuPy tests run on")
    parser.addoption("--conformance-keep-keys", action="store_true",
                     help="start each test without waiting for the last one's keys to be released")
    parser.addoption("--conformance-tasks", metavar="PATH",
                     help="write the tasks the cluster ran for each test here (JSON)")


def _open(kind: str):
    if kind == "dask-cuda":
        from dask_cuda import LocalCUDACluster
        from distributed import Client

        cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES="0", n_workers=1,
                                   device_memory_limit=DEVICE_LIMIT, dashboard_address=None)
        client = Client(cluster)
        return client, lambda: (client.close(), cluster.close())
    import spillway

    cluster = spillway.local(devices="0", device_memory_limit=DEVICE_LIMIT, dashboard_address="")
    if kind == "tiered-disk":
        cluster.client.run(_host_tier_holds_nothing)
    return cluster.client, cluster.close


def _host_tier_holds_nothing(dask_worker=None):
    dask_worker.data.host_limit = 0


@pytest.fixture(scope="session", autouse=True)
def conformance_cluster(request):
    import dask

    kind = request.config.getoption("--conformance")
    client, close = _open(kind)
    count_tasks(client)
    with dask.config.set(scheduler=client.get), assert_eq_on_cluster():
        yield client
    try:
        summary = client.run(_store_summary)
        print(f"\n{kind}: store moves per worker: {summary}")
    finally:
        close()


@pytest.fixture(autouse=True)
def released_keys(request, conformance_cluster):
    keep = request.config.getoption("--conformance-keep-keys")
    with one_test(conformance_cluster, request.node, release=not keep) as counts:
        yield
    _TASKS[request.node.nodeid] = counts


#: the tasks the scheduler ran for each test, by node id
_TASKS: dict[str, dict] = {}


def pytest_terminal_summary(terminalreporter, config):
    if not _TASKS:
        return
    idle = sorted(name for name, counts in _TASKS.items() if not counts["ran"])
    terminalreporter.write_sep("=", "tasks the cluster ran")
    terminalreporter.write_line(f"{sum(c['ran'] for c in _TASKS.values())} tasks for "
                                f"{len(_TASKS) - len(idle)} of {len(_TASKS)} tests; none for:")
    for name in idle:
        terminalreporter.write_line(f"  {name}")
    path = config.getoption("--conformance-tasks")
    if path:
        with open(path, "w") as f:
            json.dump(_TASKS, f, indent=0, sort_keys=True)


def _store_summary(dask_worker=None):
    data = dask_worker.data
    stats = getattr(data, "stats", None)
    if stats is not None and hasattr(stats, "to_json"):
        moved = stats.to_json()
        return {move: moved["count"][move] for move in moved["count"]}
    return type(data).__name__
