"""A worker SIGKILLed in the middle of a run, on real process-based CPU clusters: the run
fails within seconds with one line naming the worker and why (never Dask recomputing
everything in silence), through ``Local.compute`` of a user's collection, a workflow on
``Local.run`` and ``spillway run``; a worker that held nothing of the run does not fail it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import dask.array as da
import psutil
import pytest

import spillway
from spillway.options.errors import WorkerLost
from spillway.launch.deaths import DeathRelay, describe

#: the one line of a worker SIGKILLed during a run
KILLED = re.compile(r"^worker tcp://127\.0\.0\.1:\d+ \(pid (\d+)\) died: killed by SIGKILL "
                    r"\(the kernel's OOM killer\? see dmesg\)$")


def _slow(block):
    time.sleep(0.05)
    return block


def _collection(n=2400, chunk=200):
    """About 10 s of tasks on two one-thread workers: long enough to be killed in."""
    x = da.random.random((n, n), chunks=(chunk, chunk))
    return (x.map_blocks(_slow) + x.T.map_blocks(_slow)).sum()


def _kill_after(pid: int, seconds: float) -> dict:
    killed: dict = {}

    def kill():
        time.sleep(seconds)
        killed["at"] = time.monotonic()
        os.kill(pid, signal.SIGKILL)

    threading.Thread(target=kill, daemon=True).start()
    return killed


@pytest.fixture(scope="module")
def cluster():
    started = time.monotonic()
    with spillway.local(cpu=True, n_workers=2, threads_per_worker=1, dashboard_address="") as lc:
        # a killed worker's restart is a process start like the two just timed, on a
        # machine as loaded: it is given ten of theirs (a minute at least)
        lc.restart_wait_s = max(60.0, 10 * (time.monotonic() - started))
        yield lc


def _two_workers(cluster) -> None:
    """Until both workers are up: the nanny of a worker an earlier test killed starts it
    again, within the fixture's wait (derived from the cluster's own start); a nanny that
    stopped instead fails it at once, named."""
    from spillway.launch import scheduler_workers

    deadline = time.monotonic() + cluster.restart_wait_s
    while len(scheduler_workers(cluster.client)) < 2:
        nannies = {name: n.status.name for name, n in cluster.session.cluster.workers.items()}
        assert len(nannies) == 2 and set(nannies.values()) == {"running"}, (
            f"a nanny stopped instead of restarting its worker: {nannies}")
        assert time.monotonic() < deadline, f"no second worker within {cluster.restart_wait_s:.0f} s: {nannies}"
        time.sleep(0.2)


def _victim(cluster) -> tuple[str, int]:
    _two_workers(cluster)
    address, pid = sorted(cluster.client.run(os.getpid).items())[0]
    return address, pid


@pytest.mark.timeout(200)
def test_user_collection_fails_naming_the_killed_worker(cluster):
    address, pid = _victim(cluster)
    killed = _kill_when_under_way(cluster, pid)
    # failed, naming the worker, rather than recomputed in silence to an answer
    with pytest.raises(WorkerLost) as caught:
        cluster.compute(_collection(), progress=False)
    message = str(caught.value)
    assert "at" in killed and KILLED.match(message), message
    assert message.startswith(f"worker {address} (pid {pid}) died"), message
    # the cluster carries on: the nanny restarted the worker, and the next run completes
    _two_workers(cluster)
    assert cluster.compute(da.ones((100, 100), chunks=50).sum(), progress=False) == 10_000


@pytest.mark.timeout(200)
def test_persisted_inputs_lost_with_the_worker_fail_the_run(cluster):
    """The persisted input's chunks held by the killed worker: Dask would recompute them
    (measured: the run completed 10-12 s late, saying nothing); the run fails instead."""
    from distributed import wait

    x = cluster.client.persist(da.random.random((2400, 2400), chunks=(200, 200)))
    wait(x)
    try:
        address, pid = _victim(cluster)
        _kill_when_under_way(cluster, pid)
        with pytest.raises(WorkerLost, match=rf"^worker {re.escape(address)} \(pid {pid}\) died: killed by SIGKILL"):
            cluster.compute((x.map_blocks(_slow) + x.T.map_blocks(_slow)).sum(), progress=False)
    finally:
        del x


def _kill_when_under_way(cluster, pid: int, done: int = 30) -> dict:
    """SIGKILL ``pid`` once the client's run has ``done`` tasks finished: in the middle of
    the run however long a loaded machine takes to get there (a kill after a fixed delay
    could land before the run began, and then no run of it had anything to lose)."""
    from spillway.run.progress import client_progress

    killed: dict = {}

    def kill():
        seen = False
        while True:
            try:
                counts = cluster.client.run_on_scheduler(client_progress, cluster.client.id)
            except Exception:  # the test ended and closed the cluster: no kill for a later test
                return
            if counts and counts.get("done", 0) >= done:
                break
            if seen and counts is None:  # the run ended short of it: no kill for a later run
                return
            seen = seen or counts is not None
            time.sleep(0.1)
        killed["at"] = time.monotonic()
        os.kill(pid, signal.SIGKILL)

    threading.Thread(target=kill, daemon=True).start()
    return killed


@pytest.mark.timeout(450)
def test_a_workflow_run_fails_the_same_way(cluster):
    address, pid = _victim(cluster)
    _kill_when_under_way(cluster, pid)
    with pytest.raises(WorkerLost) as caught:
        cluster.run("transpose-sum", {"size": "3000x3000", "chunks": "100x100"}, progress=False)
    assert KILLED.match(str(caught.value)) and f"(pid {pid})" in str(caught.value), str(caught.value)


@pytest.mark.timeout(450)
def test_a_worker_that_held_nothing_of_the_run_does_not_fail_it(cluster):
    client = cluster.client
    _two_workers(cluster)
    pids = sorted(client.run(os.getpid).items())
    (keep, _), (other, other_pid) = pids
    from spillway.run.progress import track
    from spillway.launch.worker_loss import LossWatch

    y = _collection(n=1200)
    with track(client, "pinned"), LossWatch(client) as watch:
        # every task on one worker; the other is killed while they run
        futures = client.compute([y], workers=[keep], allow_other_workers=False)
        watch.follow(futures)
        killed = _kill_after(other_pid, 1.0)
        value = client.gather(futures)[0]

        def recorded() -> list[dict]:
            return [w for w in watch.harmless if w["address"] == other and w["reason"]]

        # the death, and then its nanny's reason, reach the watch after the kill, however
        # long the run took beside it
        deadline = time.monotonic() + cluster.restart_wait_s
        while not (killed and recorded()):
            assert watch.error is None, watch.error
            assert time.monotonic() < deadline, f"the kill of {other} not recorded with its reason: {watch.harmless}"
            time.sleep(0.2)
    assert watch.error is None
    assert value > 0
    # a loaded machine may see the other worker's restart come and go too; never the one
    # the run was on
    assert keep not in [w["address"] for w in watch.harmless], watch.harmless
    assert recorded()[0]["reason"] == "killed by SIGKILL (the kernel's OOM killer? see dmesg)"
    assert recorded()[0]["pid"] == other_pid
    _two_workers(cluster)


def _worker_processes(parent: int) -> list[psutil.Process]:
    found = []
    for p in psutil.Process(parent).children(recursive=True):
        try:
            if "spawn_main" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            pass
    return found


@pytest.mark.timeout(450)
def test_spillway_run_exits_with_the_line_within_seconds_of_the_kill():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "spillway", "run", "transpose-sum", "--cpu", "--n-workers", "2",
         "--threads-per-worker", "1", "--dashboard-address", "", "--param", "size=4000x4000",
         "--param", "chunks=100x100", "--progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    err: list[str] = []

    def read():
        while chunk := os.read(proc.stderr.fileno(), 4096):
            err.append(chunk.decode(errors="replace"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # under way: the progress bar has counted tasks done (however long the start took)
        while proc.poll() is None:
            done = [int(d) for d in re.findall(r"\| (\d+)/\d+ tasks", "".join(err))]
            if done and max(done) >= 30:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "".join(err)[-2000:]
        workers = _worker_processes(proc.pid)
        assert len(workers) == 2, "the two worker processes were not found"
        victim = workers[0].pid
        os.kill(victim, signal.SIGKILL)
        # the run ends on the loss with one line, rather than recomputing what the worker held
        proc.wait(timeout=300)
        reader.join(10)
        stderr = "".join(err)
        lines = [line for line in stderr.replace("\r", "\n").splitlines() if line.startswith("spillway: error:")]
        assert proc.returncode == 1, stderr[-2000:]
        assert len(lines) == 1, stderr[-2000:]
        message = lines[0].removeprefix("spillway: error: ")
        assert KILLED.match(message) and f"(pid {victim})" in message, message
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


# --- the words


def test_signals_are_named_with_what_usually_sends_them():
    assert describe("killed by signal 9") == "killed by SIGKILL (the kernel's OOM killer? see dmesg)"
    assert describe("killed by signal 11") == "killed by SIGSEGV (a crash in native code: CUDA or a library)"
    assert describe("killed by signal 15") == "killed by SIGTERM"
    assert describe("exited with status 1") == "exited with status 1"
    # the nanny's own memory kill says itself; no guess at the kernel
    assert (describe("out of memory: exceeded 95% memory budget, killed by signal 15")
            == "out of memory: exceeded 95% memory budget, killed by SIGTERM")


class _Nanny:
    """What DeathRelay reads of a nanny: its worker process (pid, address), env, name."""

    def __init__(self, pid, address):
        process = type("P", (), {"pid": pid})()
        self.process = type("WP", (), {"process": process, "worker_address": address})()
        self.env = {"CUDA_VISIBLE_DEVICES": "3,0,1,2"}
        self.name = "w3"
        self.told: list = []
        relay = self

        class Tasks:
            def call_soon(self, func, event):
                relay.told.append(event)

        self._ongoing_background_tasks = Tasks()


def test_each_nanny_tells_only_its_own_worker_s_death_with_its_gpu():
    ours, other = _Nanny(41, "tcp://127.0.0.1:1"), _Nanny(42, "tcp://127.0.0.1:2")
    relays = [DeathRelay(), DeathRelay()]
    for relay, nanny in zip(relays, (ours, other)):
        relay.setup(nanny)
    try:
        import logging

        log = logging.getLogger("distributed.nanny")
        log.info("Worker process %d was killed by signal %d", 41, 9)
        logging.getLogger("distributed.nanny.memory").warning(
            "Worker tcp://127.0.0.1:2 (pid=42) exceeded 95% memory budget. Restarting...")
        log.info("Worker process %d was killed by signal %d", 42, 15)
    finally:
        for relay, nanny in zip(relays, (ours, other)):
            relay.teardown(nanny)
    assert ours.told == [{"address": "tcp://127.0.0.1:1", "pid": 41, "reason": "killed by signal 9",
                          "gpu": "3", "name": "w3"}]
    assert [e["reason"] for e in other.told] == ["out of memory: exceeded 95% memory budget, killed by signal 15"]
    from spillway.launch.deaths import _LISTENING

    assert all(r not in _LISTENING.listeners for r in relays)


def test_a_harmless_loss_takes_its_reason_from_a_nanny_report_that_comes_after_it():
    """The scheduler's record of a removal read before the nanny's report of the death
    (a loaded machine): the entry gets its reason on a later look."""
    from spillway.launch import worker_loss

    a, b = "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"
    loss = {"address": b, "time": 1.0, "expected": False, "held": 0, "running": 0, "stimulus_id": "x",
            "affects": False}
    death = {"address": b, "pid": 12, "reason": "killed by signal 9", "time": 1.5}
    looks = iter([{"now": 0.0, "workers": [a, b], "losses": [], "deaths": []},
                  {"now": 1.2, "workers": [a], "losses": [loss], "deaths": []},
                  {"now": 1.7, "workers": [a], "losses": [loss], "deaths": [death]}])

    class Client:
        def run_on_scheduler(self, func, *args):
            assert func is worker_loss.poll
            return next(looks)

        def run(self, func, on_error=None):
            return {a: {"pid": 11, "gpu": None}}

    watch = worker_loss.LossWatch(Client())
    assert watch._check() is False
    assert watch.harmless == [{"address": b, "pid": None, "reason": None}]
    assert watch._check() is False
    assert watch.harmless == [{"address": b, "pid": 12, "reason": describe("killed by signal 9")}]
    assert watch.error is None


@pytest.mark.timeout(200)
def test_a_restart_slower_than_distributeds_lost_worker_timeout_keeps_the_worker():
    # distributed closes the nanny of a worker not back within lost-worker-timeout (15 s;
    # here a tenth of a second, shorter than any restart): spillway's local cluster keeps
    # a nanny that is bringing its worker back, and the cluster has both workers again
    import dask.config

    from spillway.launch import scheduler_workers

    with dask.config.set({"distributed.deploy.lost-worker-timeout": "0.1s"}):
        started = time.monotonic()
        with spillway.local(cpu=True, n_workers=2, threads_per_worker=1, dashboard_address="") as lc:
            wait_s = max(60.0, 10 * (time.monotonic() - started))
            nannies = lc.session.cluster.workers
            names = set(nannies)
            (address, pid), _ = sorted(lc.client.run(os.getpid).items())
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + wait_s
            while True:
                back = scheduler_workers(lc.client)
                if len(back) == 2 and address not in back:  # a restarted worker listens afresh
                    break
                assert set(nannies) == names, f"a restarting worker's nanny was closed: {sorted(nannies)}"
                assert time.monotonic() < deadline, f"the killed worker not back within {wait_s:.0f} s"
                time.sleep(0.05)
            assert set(nannies) == names
            assert lc.compute(da.ones((100, 100), chunks=50).sum()) == 10_000
