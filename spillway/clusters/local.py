"""The embedded cluster for a notebook on one's own machine (the trusted mode).

``local(**options)`` builds the one :class:`~spillway.options.settings.Options` from keywords (the
same names and layering as the CLI flags and ``DASK_SPILLWAY__*``), starts the cluster
through :func:`spillway.launch.open_cluster` and keeps it up until ``close()``. Registered
workflows run through :func:`spillway.run.compute.run_workflow`, exactly as ``spillway run``
runs them; any dask collection runs on ``.client``, which is a plain Dask client. It
scales and adapts as dask's clusters do, each new worker started from the same worker
spec as the first (:class:`~spillway.clusters.base.Cluster`).
"""

from __future__ import annotations

import contextlib
import sys

from spillway.options.errors import MainGuardMissing
from spillway.options.settings import Options

from spillway.clusters.base import Cluster

__all__ = ["Local", "local"]


def local(**option_keywords) -> Local:
    """Start the embedded cluster: ``local(rmm_pool_size="20GB")``, ``local(cpu=True,
    n_workers=2)``. Bad options raise :class:`~spillway.options.errors.OptionsError` before
    anything starts. Use as a context manager, or call ``close()``."""
    return Local(Options.resolve(**option_keywords))


class Local(Cluster):
    """The embedded cluster: workers on this machine, started from the options by
    :func:`spillway.launch.open_cluster` (see :class:`~spillway.clusters.base.Cluster` for what
    it offers)."""

    title = "spillway local cluster"

    def __init__(self, options: Options, *, inventory=None):
        from spillway.launch import open_cluster

        stack = contextlib.ExitStack()
        try:
            session = stack.enter_context(open_cluster(options, inventory=inventory))
        except MainGuardMissing as e:
            # only a script gets here, at its top level: a traceback through it would bury
            # the one line that says what to change
            print(f"spillway: error: {e}", file=sys.stderr)
            raise SystemExit(e.exit_code) from None
        super().__init__(session, stack)

    def _most_workers(self) -> int | None:
        """GPU workers: the planned GPUs' (dask-cuda starts one per visible GPU, and the
        plan made the GPUs visible); CPU workers have no bound of their own."""
        plan = self.session.plan
        if plan.kind != "gpu":
            return None
        return len(plan.gpus) * plan.workers_per_gpu
