"""A run fails within seconds when a worker it depends on dies, naming the worker and why.

distributed treats a dead worker as recoverable: the tasks it was running are sent to
another worker (each counted "suspicious"; only a task that was running on four workers
that died, ``allowed-failures`` 3, fails with KilledWorker), and every result it held,
persisted inputs included, is recomputed from the graph. With one worker per GPU that
means the restarted worker starts the run over from its first task, silently: on one
H100 the kernel's OOM killer ended the only worker of a 108 GB SVD, the nanny restarted
it, and the run sat recomputing (toward the same OOM) until the caller's 200 s limit, with
no word of the kill. Measured here on CPU workers: a run whose one worker was SIGKILLed
completes by recomputing everything, 10-12 s later than it would have.

So a run watches its workers (:class:`LossWatch`, polling the scheduler every half
second): when a worker that held a result the run still needs, or was running one of its
tasks, leaves unexpectedly, the run's futures are cancelled and the run raises
:class:`~spillway.options.errors.WorkerLost` with one line, e.g. ``worker
tcp://127.0.0.1:4321 (GPU 0, pid 811) died: killed by SIGKILL (the kernel's OOM killer?
see dmesg)``. The reason comes from the worker's nanny (:class:`~spillway.launch.deaths.DeathRelay`,
an event on the scheduler). A worker retired on purpose (its data handed over first), or
one that held nothing of the run, does not fail it; it is listed in the run's report.
"""

from __future__ import annotations

import threading
import time

from spillway import upstream
from spillway.launch.deaths import DEATH_TOPIC, describe

#: seconds between two looks at the scheduler
POLL_S = 0.5
#: seconds a loss waits for its nanny's reason before the run fails without it
REASON_WAIT_S = 2.0


def poll(known: list[str], wanted: list, since: float | None, dask_scheduler=None) -> dict:
    """Run on the scheduler: its clock, its workers, and each worker gone since ``since``
    (those of ``known`` no longer there, and those a nanny reported dead) with whether it
    took anything the keys ``wanted`` still need, and the deaths the nannies reported."""
    s = dask_scheduler
    now = time.time()
    since = now if since is None else since
    current = set(upstream.worker_addresses(s))
    deaths = [dict(msg, time=t) for t, msg in s.get_events(DEATH_TOPIC) if t >= since and isinstance(msg, dict)]
    gone = (set(known) | {d.get("address") for d in deaths if d.get("address")}) - current
    losses = []
    for address in sorted(gone):
        removal = _removal(s, address, since)
        if removal is None:
            continue  # the nanny told of the death before the scheduler removed the worker
        expected = bool(removal.get("expected"))
        lost = set(removal.get("lost-computed-tasks") or ()) | set(removal.get("lost-scattered-tasks") or ())
        running = set(removal.get("processing-tasks") or ())
        # a worker retired on purpose hands its results over first; its running tasks
        # simply run elsewhere
        keys = lost if expected else lost | running
        losses.append({"address": address, "time": removal["time"], "expected": expected,
                       "held": len(lost), "running": len(running), "stimulus_id": removal.get("stimulus_id"),
                       "affects": _reaches(s, keys, wanted, lost_scattered=removal.get("lost-scattered-tasks"))})
    return {"now": now, "workers": sorted(current), "losses": losses, "deaths": deaths}


def _removal(s, address: str, since: float) -> dict | None:
    """The scheduler's "remove-worker" event of ``address`` since ``since`` (its keys)."""
    for t, msg in reversed(s.get_events(address)):
        if t < since:
            break
        if isinstance(msg, dict) and msg.get("action") == "remove-worker":
            return dict(msg, time=t)
    return None


def _reaches(s, keys, wanted, *, lost_scattered=None) -> bool:
    """Whether any of ``keys`` is, or leads through its dependents to, one of ``wanted``.
    Scattered data lost with the worker cannot be recomputed: its dependents fail."""
    targets = set(wanted)
    if targets & set(lost_scattered or ()):
        return True
    seen: set = set()
    stack = [upstream.scheduler_task(s, k) for k in keys]
    while stack:
        ts = stack.pop()
        if ts is None or ts in seen:
            continue
        seen.add(ts)
        if upstream.task_key(ts) in targets:
            return True
        stack.extend(upstream.task_dependents(ts))
    return False


def _clean_keys(futures) -> list:
    return [f.key for f in futures]


def loss_line(loss: dict, death: dict | None, known: dict | None = None) -> str:
    """One line for a lost worker: its address, GPU and pid where known, and why."""
    known = known or {}
    gpu = (death or {}).get("gpu") or known.get("gpu")
    pid = (death or {}).get("pid") or known.get("pid")
    parts = [f"GPU {gpu}" if gpu is not None else None, f"pid {pid}" if pid else None]
    label = ", ".join(p for p in parts if p)
    who = f"worker {loss['address']}" + (f" ({label})" if label else "")
    if death and death.get("reason"):
        return f"{who} died: {describe(death['reason'])}"
    if loss.get("expected"):
        return f"{who} left the cluster (retired) and took results the run needs"
    return (f"{who} died; its nanny gave no reason (the nanny gone too, or a worker without one): "
            "see the worker's log")


class LossWatch:
    """Watches a run's workers from a thread; ``error`` is the one line once a worker the
    run depends on is lost (its futures are then cancelled with that line), and ``harmless``
    the workers that left without taking anything of the run.

    Use: ``watch = LossWatch(client)`` before the graph is submitted, ``watch.follow(futures)``
    once it is, ``watch.stop()`` after (or ``with``)."""

    def __init__(self, client, *, poll_s: float = POLL_S, reason_wait_s: float = REASON_WAIT_S):
        self.client = client
        self.poll_s = poll_s
        self.reason_wait_s = reason_wait_s
        self.error: str | None = None
        self.harmless: list[dict] = []
        self._futures: list = []
        self._seen: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._since: float | None = None
        self._known: list[str] = []
        self._facts: dict[str, dict] = {}
        self._checking = threading.RLock()
        self._pending = False
        first = self._poll([])
        if first is not None:
            self._since, self._known = first["now"], first["workers"]
        self._facts = self._worker_facts()

    def _worker_facts(self) -> dict[str, dict]:
        """address -> pid and GPU of the workers now (named in the line where the nanny
        cannot tell)."""
        try:
            return dict(self.client.run(_facts, on_error="ignore"))
        except Exception:  # noqa: BLE001 (a nicety)
            return {}

    def _poll(self, wanted: list) -> dict | None:
        try:
            return self.client.run_on_scheduler(poll, self._known, wanted, self._since)
        except Exception:  # noqa: BLE001 (the scheduler busy or gone: the run's own calls say so)
            return None

    def follow(self, futures) -> LossWatch:
        """Start watching for losses that touch ``futures`` (what the run waits for)."""
        self._futures = list(futures)
        if self._since is not None and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="spillway-loss-watch", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self._check():
                return

    def _check(self) -> bool:
        """One look at the scheduler; True once the run has failed for a loss."""
        with self._checking:
            if self.error:
                return True
            wanted = _clean_keys(self._futures)
            seen = self._poll(wanted)
            if seen is None:
                return False
            # a worker gone whose removal the scheduler has not recorded yet
            self._pending = bool(set(self._known) - set(seen["workers"]) - self._seen
                                 or {d.get("address") for d in seen["deaths"]} - self._seen - {None})
            self._known = sorted(set(self._known) | set(seen["workers"]))
            # a nanny's report of the death may land after the scheduler's record of the
            # removal (a loaded machine): the reason of a loss already seen comes with it
            for entry in self.harmless:
                death = self._death(seen, entry["address"]) if entry["reason"] is None else None
                if death and death.get("reason"):
                    entry.update(reason=describe(death["reason"]), pid=entry["pid"] or death.get("pid"))
            for loss in seen["losses"]:
                if loss["address"] in self._seen:
                    continue
                self._seen.add(loss["address"])
                if not loss["affects"]:
                    self.harmless.append(self._entry(loss, self._death(seen, loss["address"])))
                    continue
                death = self._death(seen, loss["address"]) or self._wait_for_reason(wanted, loss["address"])
                self._fail(loss_line(loss, death, self._facts.get(loss["address"])))
                return True
            return False

    def settle(self, within: float = 2.0) -> str | None:
        """After the run failed: whether a loss failed it (the line), looking again for up
        to ``within`` seconds, as Dask's own error (KilledWorker, a cancelled future) can
        come before the scheduler's record of the removal is read."""
        deadline = time.monotonic() + within
        while not self.error and self._since is not None and self._futures:
            if self._check() or not self._pending or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        return self.error

    @staticmethod
    def _death(seen: dict, address: str) -> dict | None:
        found = [d for d in seen["deaths"] if d.get("address") == address]
        return found[-1] if found else None

    def _wait_for_reason(self, wanted, address: str) -> dict | None:
        deadline = time.monotonic() + self.reason_wait_s
        while time.monotonic() < deadline:
            time.sleep(0.2)
            seen = self._poll(wanted)
            death = self._death(seen, address) if seen else None
            if death:
                return death
        return None

    def _entry(self, loss: dict, death: dict | None) -> dict:
        facts = self._facts.get(loss["address"], {})
        return {"address": loss["address"], "pid": (death or {}).get("pid") or facts.get("pid"),
                "reason": describe(death["reason"]) if death and death.get("reason")
                else ("retired" if loss["expected"] else None)}

    def _fail(self, line: str) -> None:
        self.error = line
        try:
            self.client.cancel(self._futures, reason="worker-lost", msg=line)
        except Exception:  # noqa: BLE001 (the run ends on the error all the same)
            pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        # the run is over: its results are released on the workers once nothing holds their
        # futures (held on, they kept a worker from retiring when an adaptive cluster shrank)
        self._futures = []

    def __enter__(self) -> LossWatch:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _facts(dask_worker=None) -> dict:
    """The worker's pid and GPU (runs on the worker)."""
    import os

    gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0] or None
    kind = None
    try:
        from .plugins import PLUGIN_NAME

        kind = dask_worker.plugins[PLUGIN_NAME].kind
    except Exception:  # noqa: BLE001
        pass
    return {"pid": os.getpid(), "gpu": gpu if kind == "gpu" else None}
