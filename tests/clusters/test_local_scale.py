"""dask's Cluster verbs on what ``spillway.local()`` returns: scale, adapt,
wait_for_workers, get_logs, dashboard_link; every worker started later is built as the
first ones were (spillway's worker config, its plugins)."""

from __future__ import annotations

import time
import types

import dask.array as da
import numpy as np
import pytest

import spillway
from spillway import OptionsError
from spillway.launch.plugins import PLUGIN_NAME
from spillway.clusters.local import Local

PIECE = 2**20  # a non-default worker option, which only the workers' config carries


@pytest.fixture(scope="module")
def cluster():
    with spillway.local(cpu=True, n_workers=1, dashboard_address="127.0.0.1:0", zarr_decode_piece_bytes=PIECE) as lc:
        yield lc


def _built_like_the_first(dask_worker):
    import dask.config

    return {"piece": dask.config.get("spillway.zarr-decode-piece-bytes", None),
            "setup": PLUGIN_NAME in dask_worker.plugins}


def _back_to_one_worker(cluster, timeout=80.0):
    """The fixture's one worker again once adapting stopped: an adapt step already under
    way when it stopped may still take back the worker asked for (on a loaded host), so
    the worker is asked for until it is there."""
    deadline = time.monotonic() + timeout
    while True:
        cluster.scale(1)
        try:
            cluster.wait_for_workers(1, timeout=min(15.0, max(1.0, deadline - time.monotonic())))
            return
        except TimeoutError:
            assert time.monotonic() < deadline, "no worker after scale(1)"


def _until(condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_scale_up_builds_each_new_worker_from_the_spec(cluster):
    assert cluster.dashboard_link.startswith("http://127.0.0.1:")
    cluster.scale(3)
    cluster.wait_for_workers(3, timeout=120)
    assert cluster.n_workers == 3
    built = cluster.client.run(_built_like_the_first)
    assert list(built.values()) == [{"piece": PIECE, "setup": True}] * 3, built
    report = cluster.run("transpose-sum", size="600x600", chunks="200x200", verify=True, progress=False)
    assert report["verify"]["ok"] and report["cluster"]["n_workers"] == 3


def test_scale_down_hands_the_data_over_first(cluster):
    cluster.scale(3)
    cluster.wait_for_workers(3, timeout=120)
    x = cluster.client.persist(da.random.default_rng(1).random((600, 600), chunks=(100, 100)))
    total = float(x.sum().compute())
    cluster.scale(1)
    _until(lambda: cluster.n_workers == 1)
    held = cluster.client.who_has(x)
    assert all(held.values()), "a persisted chunk was lost with its worker"
    assert float(x.sum().compute()) == pytest.approx(total)
    assert cluster.n_workers == 1


def test_adapt_to_none_and_back_for_a_run(cluster):
    adaptive = cluster.adapt(minimum=0, maximum=2, interval="200ms", wait_count=2)
    try:
        _until(lambda: cluster.n_workers == 0)
        # admission reads the workers that are up: the run brings the first one up itself
        report = cluster.run("transpose-sum", size="400x400", verify=True, progress=False)
        assert report["verify"]["ok"] and report["cluster"]["n_workers"] >= 1
        value = cluster.compute(da.ones((300, 300), chunks=100).sum(), progress=False)
        assert float(value) == 90_000
    finally:
        adaptive.stop()
    _back_to_one_worker(cluster)  # a fixed size again


@pytest.mark.timeout(120)
def test_a_run_at_none_gets_its_worker_even_when_adapt_would_take_it_back_before_it_starts(cluster):
    """Adaptive, seeing no task, takes back a worker asked for and not yet arrived after
    ``wait_count`` intervals: here one 50 ms interval, far less than a worker's start. The
    run holds the minimum until it ends, so its worker arrives and stays."""
    adaptive = cluster.adapt(minimum=0, maximum=2, interval="50ms", wait_count=1)
    try:
        _until(lambda: cluster.n_workers == 0)
        report = cluster.run("transpose-sum", size="400x400", verify=True, progress=False)
        assert report["verify"]["ok"] and report["cluster"]["n_workers"] >= 1
        assert adaptive.minimum == 0  # given back once the run ended
    finally:
        adaptive.stop()
    _back_to_one_worker(cluster)


def test_logs_of_the_cluster_the_scheduler_and_the_workers(cluster):
    logs = cluster.get_logs()
    assert "Scheduler" in logs and any(key not in ("Cluster", "Scheduler") for key in logs), list(logs)


def test_bad_sizes_are_one_line(cluster):
    for call, says in ((lambda: cluster.scale(-1), "scale: -1 must be an integer >= 0"),
                       (lambda: cluster.scale(1.5), "scale: 1.5 must be an integer >= 0"),
                       (lambda: cluster.adapt(minimum=3, maximum=2), "minimum: 3 is above maximum 2"),
                       (lambda: cluster.adapt(minimum=0), "maximum: give the most workers")):
        with pytest.raises(OptionsError) as refused:
            call()
        assert str(refused.value).startswith(says) and "\n" not in str(refused.value)


def test_a_run_on_a_cluster_scaled_to_none_is_one_line(cluster):
    cluster.scale(0)
    _until(lambda: cluster.n_workers == 0)
    try:
        with pytest.raises(OptionsError, match=r"^workers: this cluster has none; scale it up first"):
            cluster.run("transpose-sum", progress=False)
    finally:
        cluster.scale(1)
        cluster.wait_for_workers(1, timeout=120)


def test_gpu_workers_scale_to_the_planned_gpus_at_most():
    local = Local.__new__(Local)
    local.session = types.SimpleNamespace(plan=types.SimpleNamespace(kind="gpu", gpus=(0, 1), workers_per_gpu=2))
    assert local._most_workers() == 4
    with pytest.raises(OptionsError, match=r"^scale: 5 workers is more than the 4 this cluster can start$"):
        local._check_size(5, "scale")
    local.session.plan.kind = "cpu"
    assert local._most_workers() is None


def test_an_attached_session_is_not_scaled_from_here():
    local = Local.__new__(Local)
    local.session = types.SimpleNamespace(cluster=None)
    with pytest.raises(OptionsError, match="attached to a scheduler it did not start"):
        local._scalable("scale")


def test_values_stay_numpys(cluster):
    x = np.arange(12.0).reshape(3, 4)
    assert float(cluster.compute(da.from_array(x, chunks=2).sum(), progress=False)) == x.sum()


def test_a_closed_cluster_says_so_in_one_line():
    lc = spillway.local(cpu=True, n_workers=1, dashboard_address="")
    lc.close()
    for call in (lambda: lc.run("transpose-sum", progress=False), lambda: lc.scale(2), lambda: lc.n_workers):
        with pytest.raises(spillway.SpillwayError) as closed:
            call()
        assert str(closed.value) == ("spillway local cluster: closed; start another (spillway.local(...), "
                                     "spillway.slurm(...))")
    assert repr(lc) == "<spillway local cluster: closed>"
    lc.close()  # a second close does nothing


ADAPT_SCRIPT = '''
import time
import spillway

def until(cluster, n, what):
    deadline = time.monotonic() + 120
    while cluster.n_workers != n:
        assert time.monotonic() < deadline, f"no {what} within 120 s: {cluster.n_workers} workers"
        time.sleep(0.1)

if __name__ == "__main__":
    with spillway.local(cpu=True, n_workers=2, dashboard_address="127.0.0.1:0") as cluster:
        cluster.adapt(minimum=0, maximum=2, interval="100ms", wait_count=2)
        for cycle in range(3):
            until(cluster, 0, "scale-down to 0")
            futures = cluster.client.map(time.sleep, [0.5] * 40, pure=False)
            until(cluster, 2, "scale-up to 2")
            cluster.client.gather(futures)
            del futures
        until(cluster, 0, "last scale-down to 0")
        print("cycles done")
'''


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_adapting_down_and_up_prints_no_error(tmp_path):
    """Scale-downs under adapt() leave nothing alarming in the output: no ERROR line of a
    nanny whose close was cancelled, no traceback of a worker's stop queue."""
    import subprocess
    import sys

    (tmp_path / "adapt.py").write_text(ADAPT_SCRIPT)
    done = subprocess.run([sys.executable, "adapt.py"], cwd=tmp_path, capture_output=True, text=True, timeout=360)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "cycles done" in done.stdout, output[-3000:]
    alarming = [line for line in output.splitlines() if "ERROR" in line or "Traceback" in line]
    assert not alarming, output[-3000:]
