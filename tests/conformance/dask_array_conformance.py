"""A pytest plugin that runs dask's own array tests (shipped in the dask wheel) on a
cluster of CPU workers, with dask's ``assert_eq`` computing there, so that every rechunk
and map_overlap those tests build takes the route a spillway cluster gives them
(:mod:`spillway.datapath.collective.method`) and runs on its workers.

    PYTHONPATH=tests/conformance python -m pytest -p dask_array_conformance -p no:randomly \
        --array-conformance=control --conformance-outcomes=control.json \
        --pyargs $(python tests/conformance/dask_array_suite.py)
    PYTHONPATH=tests/conformance python -m pytest -p dask_array_conformance \
        --array-conformance=spillway --conformance-control=control.json --pyargs ...

``--array-conformance`` picks the cluster, started once a session and made dask's default
scheduler (its client is the default client, which dask's rechunk asks before it takes
its peer-to-peer method):

* ``spillway``: ``spillway.local(cpu=True, n_workers=2)``;
* ``control``: plain ``distributed.LocalCluster(n_workers=2)``, worker processes as
  spillway's, one thread each: a test that fails here fails for a reason of dask, of
  distributed or of what is installed, not of spillway.

The control's run fails where a test fails that :data:`dask_array_suite.CONTROL_FAILURES`
does not name (each name there says why it fails); spillway's run, given the control's
outcomes, fails where a test fails on spillway and did not fail on the control (but for
the cases of a test function that fails on the control in some runs and not others,
:func:`dask_array_suite.varies_on_control`: they are not compared). The tests
:data:`dask_array_suite.NOT_RUN` names run on neither. Each test
starts on an empty cluster (the last test's keys released, as dask_cupy_conformance does),
and a test's outcome is written with the tasks the cluster ran for it.
"""

from __future__ import annotations

import json

import pytest

from dask_array_suite import NOT_RUN, control_failure, in_shard, shared_id, varies_on_control
from on_cluster import assert_eq_on_cluster, count_tasks, one_test

CHOICES = ("spillway", "control")
WORKERS = 2


def pytest_addoption(parser):
    group = parser.getgroup("dask array conformance")
    group.addoption("--array-conformance", choices=CHOICES, default="spillway",
                    help="the cluster dask's array tests run on")
    group.addoption("--conformance-outcomes", metavar="PATH",
                    help="write each test's outcome and the tasks the cluster ran for it here (JSON)")
    group.addoption("--conformance-control", metavar="PATH",
                    help="the control's outcomes: fail only where a test fails here and not there")
    group.addoption("--conformance-shard", metavar="K/N|ci|rest", default="1/1",
                    help="run the K-th of N shards of the sharded modules (dask_array_suite.SHARDED), "
                         "ci: the share of each module CI runs (dask_array_suite.CI_SHARES), "
                         "or rest: every test ci leaves out (run by hand)")


def _open(kind: str):
    if kind == "control":
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True,
                               dashboard_address=":0")
        client = Client(cluster)
        return client, lambda: (client.close(), cluster.close())
    import spillway

    cluster = spillway.local(cpu=True, n_workers=WORKERS, dashboard_address="")
    return cluster.client, cluster.close


def pytest_collection_modifyitems(config, items):
    shard = config.getoption("--conformance-shard")
    kept = [item for item in items
            if in_shard(shared_id(item.nodeid), shard) and shared_id(item.nodeid) not in NOT_RUN]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


@pytest.fixture(scope="session", autouse=True)
def conformance_cluster(request):
    client, close = _open(request.config.getoption("--array-conformance"))
    try:
        count_tasks(client)
        with assert_eq_on_cluster():
            yield client
    finally:
        close()


@pytest.fixture(autouse=True)
def released_keys(request, conformance_cluster):
    with one_test(conformance_cluster, request.node):
        yield


class Outcomes:
    """Each test's outcome (``failed`` where its setup, call or teardown failed), by the
    id it has in every venv (:func:`dask_array_suite.shared_id`)."""

    def __init__(self):
        self.outcomes: dict[str, str] = {}
        self.tasks: dict[str, dict] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        name = shared_id(report.nodeid)
        if report.failed:
            self.outcomes[name] = "failed"
        elif self.outcomes.get(name) != "failed" and (report.when == "call" or name not in self.outcomes):
            marked = hasattr(report, "wasxfail")
            self.outcomes[name] = {"passed": "xpassed", "skipped": "xfailed"}[report.outcome] if marked \
                else report.outcome
        for key, value in report.user_properties:
            if key == "tasks":
                self.tasks[name] = value

    def failed(self) -> set[str]:
        return {name for name, outcome in self.outcomes.items() if outcome == "failed"}


def pytest_configure(config):
    config.pluginmanager.register(Outcomes(), "conformance-outcomes")


def unexplained(config, failed: set[str]) -> tuple[set[str], str]:
    """The failures this run is to fail for, and what they were measured against: the
    control's outcomes where given, else the failures the suite names."""
    path = config.getoption("--conformance-control")
    if path is None:
        return {name for name in failed if control_failure(name) is None}, \
            "not named in dask_array_suite.CONTROL_FAILURES"
    with open(path) as f:
        control = json.load(f)["outcomes"]
    return {name for name in failed if control.get(name) != "failed" and not varies_on_control(name)}, \
        "passing (or not run) on the control"


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    outcomes = config.pluginmanager.get_plugin("conformance-outcomes")
    path = config.getoption("--conformance-outcomes")
    if path:
        with open(path, "w") as f:
            json.dump({"cluster": config.getoption("--array-conformance"), "outcomes": outcomes.outcomes,
                       "tasks": outcomes.tasks}, f, indent=0, sort_keys=True)
    if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        return  # interrupted, or a usage or collection error: pytest's own status stands
    failing, against = unexplained(config, outcomes.failed())
    config._conformance_verdict = (sorted(outcomes.failed()), sorted(failing), against)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED if failing else pytest.ExitCode.OK


def pytest_terminal_summary(terminalreporter, config):
    verdict = getattr(config, "_conformance_verdict", None)
    outcomes = config.pluginmanager.get_plugin("conformance-outcomes")
    if verdict is None:
        return
    failed, failing, against = verdict
    ran = sum(t["ran"] for t in outcomes.tasks.values())
    computed = sum(1 for t in outcomes.tasks.values() if t["ran"])
    kind = config.getoption("--array-conformance")
    terminalreporter.write_sep("=", f"dask array conformance on {kind}")
    terminalreporter.write_line(f"{ran} tasks ran on the cluster for {computed} of {len(outcomes.tasks)} tests")
    for name in failed:
        reason = control_failure(name)
        mark = "UNEXPLAINED" if name in failing else "expected"
        terminalreporter.write_line(f"{mark}: {name}" + (f" ({reason})" if reason else ""))
    if failing:
        terminalreporter.write_line(f"{len(failing)} failures {against}: the run fails")
    else:
        terminalreporter.write_line(f"every failure ({len(failed)}) is also the control's: the run passes")
