"""What a notebook holds of a running spillway cluster, whoever started it: the client,
registered workflows run as ``spillway run`` runs them, the user's own collections with
the same progress bar and worker-loss watch, Zarr results read back, and dask's Cluster
verbs (``scale``, ``adapt``, ``wait_for_workers``, ``get_logs``, ``dashboard_link``) on
the cluster object underneath. :class:`~.local.Local` (``spillway.local()``) and
:class:`~.slurm.SlurmCluster` (``spillway.slurm()``) are the two kinds.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
import uuid
from collections.abc import Mapping
from typing import Any

from spillway import upstream
from spillway.options.errors import OptionsError, SpillwayError

from spillway.run.bars import advance, progress_bar
from spillway.run.report import Report

#: seconds :meth:`Cluster.run` waits for an adaptive cluster's first workers
FIRST_WORKERS_TIMEOUT_S = 300
#: a run or compute on a fixed cluster scaled to none
NO_WORKERS = "workers: this cluster has none; scale it up first (cluster.scale(2))"


def worker_count(value, name: str) -> int:
    """A number of workers (or jobs) as given to scale or adapt: an integer of at least 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise OptionsError(f"{name}: {value!r} must be an integer >= 0")
    return value


def worker_names(entry, spec: Mapping) -> list:
    """The names of the workers an entry of a cluster's worker spec starts: the entry's own,
    or with each suffix of its group (a job of several worker processes: ``job-0``, ...)."""
    group = spec.get("group") if isinstance(spec, Mapping) else None
    return [f"{entry}{suffix}" for suffix in group] if group else [entry]


def entries_to_close(spec: Mapping, running: set, keep: int) -> list:
    """Which entries of worker spec ``spec`` go when it shrinks to ``keep``, as SpecCluster
    chooses them: those none of whose workers runs yet, then the newest; ``running`` names
    the workers up."""
    entries = list(spec)
    if len(entries) <= keep:
        return []
    waiting = [e for e in reversed(entries) if not any(n in running for n in worker_names(e, spec[e]))]
    started = [e for e in reversed(entries) if e not in waiting]
    return (waiting + started)[:len(entries) - keep]


def session_config(config: Mapping) -> dict:
    """Dask settings for the user's own code while a spillway cluster is open (local, attached
    or of Slurm jobs: the same code takes the same path on each): rechunks take the
    peer-to-peer path, which on spillway's clusters is the collective
    (:mod:`spillway.datapath.collective`: pieces cut once, moved in bulk device to device,
    a few tasks a chunk) whatever the graph's size; dask alone would pick its task-based
    method below its threshold. A method the user chose is kept."""
    chosen = config.get("array", {}).get("rechunk", {}).get("method")
    if chosen is not None:
        return {}
    return {"array.rechunk.method": "p2p"}


def adaptive_that_retires():
    """dask's Adaptive, whose scale-down retires the workers without closing them and then
    has the cluster close their nannies, as SpecCluster closes the workers it drops.

    Adaptive's own asks the scheduler to close the retired workers as well; each then
    closes itself, behind its nanny's back, while the cluster closes the nanny: the
    nanny's close started by the worker's exit is cancelled by the cluster's (an ERROR
    and a traceback ending in CancelledError), and the worker process's stop-queue thread
    is left reading a queue its own exit closes ("Worker process died unexpectedly").
    A nanny that stops its worker itself does neither. The workers stay on the
    scheduler's books (``remove=False``) until their nannies stop them: removed there, the
    scheduler would close its stream to each, and a worker whose stream breaks closes
    itself through its nanny all the same (the race again, seen on a loaded 2-core host)."""
    from distributed.deploy.adaptive import Adaptive

    class RetiringAdaptive(Adaptive):
        async def scale_down(self, workers):
            if not workers:
                return
            await self.scheduler.retire_workers(names=workers, remove=False, close_workers=False)
            await self.cluster.scale_down(workers)

    return RetiringAdaptive


class Cluster:
    """A running cluster: ``client`` is its Dask client, ``dashboard_link`` the Dask
    dashboard, ``kind`` "gpu" or "cpu". ``session`` is the
    :class:`~spillway.launch.Session` it runs on; ``stack`` closes it."""

    #: what the cluster is called in its repr and errors
    title = "spillway cluster"

    def __init__(self, session, stack: contextlib.ExitStack):
        self.session = session
        self.options = session.options
        self._stack = stack
        self._closed = False
        # the scheduler and the nannies of a local cluster log here: a scale-down's retired
        # workers would print distributed's warnings into the notebook
        from spillway.launch.plugins import quiet_retirement

        quiet_retirement()
        import dask.config

        stack.enter_context(dask.config.set(session_config(dask.config.config)))

    # --- what is running

    @property
    def client(self):
        if self._closed:
            # rather than distributed's "IOLoop is closed" from deep in the first call
            raise SpillwayError(f"{self.title}: closed; start another (spillway.local(...), spillway.slurm(...))")
        return self.session.client

    @property
    def dashboard_link(self) -> str | None:
        """The Dask dashboard's address (None where the cluster has none)."""
        return self.session.dashboard_link

    @property
    def kind(self) -> str:
        return self.session.kind

    @property
    def n_workers(self) -> int:
        """Workers up now (scale and adapt change it)."""
        from spillway.launch import scheduler_workers

        return len(scheduler_workers(self.client))

    @property
    def worker_bytes(self) -> int:
        """Memory one worker holds before it spills: device memory on GPU workers."""
        from spillway.run.target import target_of

        return target_of(self.session).worker_bytes

    def workflows(self) -> list[dict]:
        """The catalogue, with the defaults of this cluster."""
        from spillway import workflows
        from spillway.run.target import target_of

        return workflows.catalogue(target_of(self.session))

    # --- dask's Cluster verbs

    def scale(self, n: int) -> None:
        """Scale to ``n`` workers, each started from the cluster's worker spec as the first
        ones were. Workers that go hand their data to the others first (their results stay).
        Ends adaptive scaling: a fixed size was asked for."""
        n = worker_count(n, "scale")
        self._check_size(n, "scale")
        self._resize(n)

    def _resize(self, entries: int) -> None:
        """The cluster underneath at ``entries`` entries of its worker spec (a worker each
        here; a Slurm job of a node's workers in :class:`~spillway.clusters.slurm.SlurmCluster`)."""
        from distributed.deploy.spec import SpecCluster

        cluster = self._scalable("scale")
        upstream.end_adapting(cluster)
        going = entries_to_close(cluster.worker_spec, self._worker_names(), entries)
        if going:
            # as Adaptive scales down: retired by name first, their data handed to the
            # others (distributed's own scale() passes retire_workers the names where it
            # takes addresses, so nothing would be moved and what they held recomputed),
            # then these very entries closed (scale() would pick its own)
            names = [name for entry in going for name in worker_names(entry, cluster.worker_spec[entry])]
            # their nannies stop them; kept on the scheduler's books till then (see
            # adaptive_that_retires)
            self.client.retire_workers(names=names, close_workers=False, remove=False)
            upstream.close_spec_workers(cluster, going)
        if len(cluster.worker_spec) < entries:
            # SpecCluster's own: a subclass's scale(n) may count workers, not entries
            SpecCluster.scale(cluster, entries)

    def _worker_names(self) -> set:
        from spillway.launch import scheduler_workers

        return {w.get("name") for w in scheduler_workers(self.client).values()}

    def adapt(self, minimum: int = 0, maximum: int | None = None, **adaptive):
        """Scale between ``minimum`` and ``maximum`` workers with the work queued (dask's
        ``Adaptive``; ``interval``, ``wait_count`` and the rest pass on to it). Returns it."""
        minimum = worker_count(minimum, "minimum")
        if maximum is None:
            maximum = self._most_workers()
            if maximum is None:
                raise OptionsError("maximum: give the most workers this cluster may scale to")
        maximum = worker_count(maximum, "maximum")
        if minimum > maximum:
            raise OptionsError(f"minimum: {minimum} is above maximum {maximum}")
        self._check_size(maximum, "maximum")
        adaptive.setdefault("Adaptive", adaptive_that_retires())
        return self._scalable("adapt").adapt(minimum=minimum, maximum=maximum, **adaptive)

    def wait_for_workers(self, n: int, timeout: float | None = None) -> None:
        """Block until ``n`` workers are up (``timeout`` seconds at most)."""
        self.client.wait_for_workers(worker_count(n, "wait_for_workers"), timeout=timeout)

    def get_logs(self, cluster: bool = True, scheduler: bool = True, workers: bool = True) -> dict:
        """The cluster manager's, the scheduler's and each worker's log lines, by name."""
        if self.session.cluster is None:
            return self.client.get_worker_logs() if workers else {}
        return self.session.cluster.get_logs(cluster=cluster, scheduler=scheduler, workers=workers)

    def _scalable(self, verb: str):
        cluster = self.session.cluster
        if cluster is None or not hasattr(cluster, "worker_spec"):
            raise OptionsError(f"{verb}: this session is attached to a scheduler it did not start; "
                               "whoever started it scales it")
        return cluster

    def _adapting(self):
        """The running Adaptive, or None."""
        return upstream.adaptive_of(self.session.cluster)

    def _most_workers(self) -> int | None:
        """The most workers this cluster can have (None: no bound of its own)."""
        return None

    def _check_size(self, n: int, name: str) -> None:
        most = self._most_workers()
        if most is not None and n > most:
            raise OptionsError(f"{name}: {n} workers is more than the {most} this cluster can start")

    @contextlib.contextmanager
    def _workers_held(self):
        """Workers to run on while the block runs: an adaptive cluster at none is brought to
        its minimum (at least one) first, since admission reads the capacity of the workers
        that are up, and its minimum is held there until the block ends; a fixed cluster
        scaled to none is refused in one line.

        Held, because Adaptive, seeing no task yet, takes back a worker that was asked for
        and has not arrived once ``wait_count`` intervals pass: a worker that takes longer to
        start (a GPU worker's 10 s; a CPU worker on a loaded 2-core host) never arrived, and
        the run waited out its whole timeout (CI, 2026-11-28)."""
        if self.n_workers:
            yield
            return
        adaptive = self._adapting()
        if adaptive is None:
            raise OptionsError(NO_WORKERS)
        before = adaptive.minimum
        want = max(1, int(before))
        adaptive.minimum = want
        try:
            self.session.cluster.scale(want)
            self.wait_for_workers(want, timeout=FIRST_WORKERS_TIMEOUT_S)
            yield
        finally:
            adaptive.minimum = before

    # --- running things

    def run(self, workflow: str, params: Mapping[str, Any] | None = None, *, verify: bool = False,
            output: str | None = None, arrays: Mapping[str, Any] | None = None, progress=True,
            **more_params) -> Report:
        """Run a registered workflow and return its report.

        Parameters come as a mapping, keywords, or both. ``output`` is a Zarr v3 path for
        an array result (read back with :meth:`open`); ``arrays`` hands dask, CuPy or
        NumPy arrays to the workflow's array inputs. ``progress``: True for a bar (a
        widget in Jupyter), a stream for a text bar on it, False for none.
        """
        from spillway.run.compute import run_workflow

        params = {**(params or {}), **more_params}
        kw = dict(verify=verify, output=output, arrays=dict(arrays) if arrays else None)
        with self._workers_held():
            return Report(self._watch(workflow, lambda: run_workflow(self.session, workflow, params, **kw), progress))

    def compute(self, *collections, progress=True, label: str = "compute"):
        """Compute dask collections on the cluster (one graph) and return their values,
        as ``dask.compute`` does, with the same progress bar as workflows."""
        from spillway.options.errors import WorkerLost
        from spillway.launch.worker_loss import LossWatch

        from spillway.run.progress import track

        client = self.client
        if self._adapting() is None and not self.n_workers:
            # an adaptive cluster scales up for the queued tasks itself
            raise OptionsError(NO_WORKERS)

        def compute():
            # a worker the computation depends on that dies fails it at once, naming the
            # worker and why, rather than Dask recomputing everything it held in silence
            with track(client, f"{label}-{uuid.uuid4().hex[:8]}"), LossWatch(client) as watch:
                try:
                    futures = client.compute(list(collections))
                    watch.follow(futures)
                    return client.gather(futures)
                except Exception:
                    if watch.settle():
                        raise WorkerLost(watch.error) from None
                    raise

        values = self._watch(label, compute, progress)
        return values[0] if len(values) == 1 else tuple(values)

    def _watch(self, label: str, work, progress):
        """Run ``work`` in a thread while this one draws the scheduler's task count (when
        ``progress`` asks for a bar); an interrupt (the notebook's stop button) cancels
        this client's tasks."""
        client = self.client
        bar = None
        drawn = False  # a bar is made at most once (progress_bar is None for a redirected log)
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spillway-run") as pool:
            future = pool.submit(work)
            try:
                while True:
                    try:
                        result = future.result(timeout=0.1)
                        break
                    except concurrent.futures.TimeoutError:
                        pass
                    if not progress or (drawn and bar is None):
                        continue
                    counts = _read_progress(client)
                    if counts and counts.get("total"):
                        # made only once tasks arrive, so refused parameters draw no bar
                        if not drawn:
                            bar, drawn = progress_bar(label, progress), True
                        if bar is not None:
                            advance(bar, counts["done"], counts["total"])
                if bar is not None:
                    advance(bar, bar.total, bar.total)
                return result
            except KeyboardInterrupt:
                _cancel_run(client, future)
                # what stopped, in the interrupt's own line (the frame it landed in is ours)
                raise KeyboardInterrupt(f"stopped {label}: its tasks are cancelled, the cluster stays up") from None
            finally:
                if bar is not None:
                    bar.close()

    def open(self, path: str, *, backend: str = "auto"):
        """A lazy dask array over a Zarr v3 array (a run's output, or any array of a store
        such as ``store.zarr/t2m``): CuPy chunks on GPU machines, each chunk file read into
        device memory with KvikIO by the worker that computes it (workflows.zarr)."""
        from spillway.workflows.outputs import open_output

        return open_output(path, backend=backend)

    # --- lifetime

    def close(self):
        """Stop what this cluster started; a second close does nothing, and any other use
        after it says in one line that the cluster is closed."""
        if not self._closed:
            self._closed = True
            self._stack.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _repr_html_(self) -> str:
        import html

        if self._closed:
            return f"<b>{html.escape(self.title)}</b>: closed"

        link = self.dashboard_link
        dash = f"<a href='{html.escape(link)}' target='_blank'>{html.escape(link)}</a>" if link else "off"
        return (f"<table class='spillway'><caption style='text-align:left'><b>{html.escape(self.title)}</b>"
                f"</caption><tr><th style='text-align:left'>workers</th><td>{self.n_workers} {self.kind} "
                f"({html.escape(self.session.plan.protocol)})</td></tr>"
                f"<tr><th style='text-align:left'>scheduler</th><td><code>"
                f"{html.escape(self.session.scheduler_address)}</code></td></tr>"
                f"<tr><th style='text-align:left'>dashboard</th><td>{dash}</td></tr></table>")

    def __repr__(self):
        if self._closed:
            return f"<{self.title}: closed>"
        return f"<{self.title}: {self.n_workers} {self.kind} workers, dashboard {self.dashboard_link}>"


def _read_progress(client) -> dict | None:
    from spillway.run.progress import client_progress

    try:
        return client.run_on_scheduler(client_progress, client.id)
    except Exception:  # the count is a nicety; the run's own errors come from its thread
        return None


def _cancel_run(client, run: concurrent.futures.Future, timeout: float = 30):
    """Cancel this client's tasks until the run's thread has ended and nothing is left.

    Cancelling once is not enough: a graph the thread has just submitted can reach the
    scheduler after the cancel does (they travel on different comms), so its futures
    are cancelled again until none remain."""
    from distributed import Future

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        futures = [Future(key, client) for key in list(client.futures)]
        if futures:
            client.cancel(futures)
        elif run.done():
            return
        concurrent.futures.wait([run], timeout=0.5)
