"""The embedded cluster for a notebook on one's own machine (the trusted mode).

``local(**options)`` builds the one :class:`~spillway.cluster.options.Options` from keywords (the
same names and layering as the CLI flags and ``DASK_SPILLWAY__*``), starts the cluster
through :func:`spillway.cluster.launch.open_cluster` and keeps it up until ``close()``. Registered
workflows run through :func:`spillway.run.compute.run_workflow`, exactly as ``spillway run``
runs them; any dask collection runs on ``.client``, which is a plain Dask client.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import sys
import time
import uuid
from collections.abc import Mapping
from typing import Any

from .bars import advance, progress_bar
from .report import Report
from spillway.cluster.errors import MainGuardMissing
from spillway.cluster.options import Options

__all__ = ["Local", "local"]


def local(**option_keywords) -> Local:
    """Start the embedded cluster: ``local(rmm_pool_size="20GB")``, ``local(cpu=True,
    n_workers=2)``. Bad options raise :class:`~spillway.cluster.errors.OptionsError` before
    anything starts. Use as a context manager, or call ``close()``."""
    return Local(Options.resolve(**option_keywords))


def session_config(kind: str, config: Mapping) -> dict:
    """Dask settings for the user's own code while a local cluster is open: on GPU workers,
    rechunks move device chunks as they are (the task-based method, as spillway's rechunk
    workflow does) rather than through dask's peer-to-peer shuffle, which shards them
    through host memory and failed plain dask-cuda on a 200 GB rechunk. A method the user
    chose is kept."""
    chosen = config.get("array", {}).get("rechunk", {}).get("method")
    if kind != "gpu" or chosen is not None:
        return {}
    return {"array.rechunk.method": "tasks"}


class Local:
    """A running embedded cluster. ``client`` is its Dask client, ``dashboard_link`` the
    Dask dashboard, ``kind`` "gpu" or "cpu"."""

    def __init__(self, options: Options, *, inventory=None):
        from spillway.cluster.launch import open_cluster

        self.options = options
        self._stack = contextlib.ExitStack()
        try:
            self.session = self._stack.enter_context(open_cluster(options, inventory=inventory))
        except MainGuardMissing as e:
            # only a script gets here, at its top level: a traceback through it would bury
            # the one line that says what to change
            print(f"spillway: error: {e}", file=sys.stderr)
            raise SystemExit(e.exit_code) from None
        import dask.config

        self._stack.enter_context(dask.config.set(session_config(self.session.kind, dask.config.config)))

    # --- what is running

    @property
    def client(self):
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
        return self.session.n_workers

    @property
    def worker_bytes(self) -> int:
        """Memory one worker holds before it spills: device memory on GPU workers."""
        from .target import target_of

        return target_of(self.session).worker_bytes

    def workflows(self) -> list[dict]:
        """The catalogue, with the defaults of this cluster."""
        from spillway import workflows
        from .target import target_of

        return workflows.catalogue(target_of(self.session))

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
        from .compute import run_workflow

        params = {**(params or {}), **more_params}
        kw = dict(verify=verify, output=output, arrays=dict(arrays) if arrays else None)
        return Report(self._watch(workflow, lambda: run_workflow(self.session, workflow, params, **kw), progress))

    def compute(self, *collections, progress=True, label: str = "compute"):
        """Compute dask collections on the cluster (one graph) and return their values,
        as ``dask.compute`` does, with the same progress bar as workflows."""
        from spillway.cluster.errors import WorkerLost
        from .progress import track
        from spillway.cluster.worker_loss import LossWatch

        client = self.client

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
                raise
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
        self._stack.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _repr_html_(self) -> str:
        import html

        link = self.dashboard_link
        dash = f"<a href='{html.escape(link)}' target='_blank'>{html.escape(link)}</a>" if link else "off"
        return (f"<table class='spillway'><caption style='text-align:left'><b>spillway local cluster</b></caption>"
                f"<tr><th style='text-align:left'>workers</th><td>{self.n_workers} {self.kind} "
                f"({html.escape(self.session.plan.protocol)})</td></tr>"
                f"<tr><th style='text-align:left'>scheduler</th><td><code>"
                f"{html.escape(self.session.scheduler_address)}</code></td></tr>"
                f"<tr><th style='text-align:left'>dashboard</th><td>{dash}</td></tr></table>")

    def __repr__(self):
        return f"<spillway local cluster: {self.n_workers} {self.kind} workers, dashboard {self.dashboard_link}>"


def _read_progress(client) -> dict | None:
    from .progress import client_progress

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
