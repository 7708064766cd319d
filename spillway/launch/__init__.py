"""Launching: start (or attach to) a cluster from an :class:`~spillway.options.settings.Options`,
every launcher in this one package, each one module behind one protocol
(:class:`~.backend.Backend`).

``open_cluster(options)`` is the one way in for the clusters of this machine: it plans
against the GPU inventory (raising :class:`~spillway.options.errors.OptionsError` before
anything starts), starts the local GPU or CPU cluster or attaches to a running scheduler
(the plan's kind picks the backend: :data:`~.backend.BACKENDS`), registers spillway's
worker plugin and yields a :class:`Session`. Leaving the context shuts down what it
started.

The launchers, one module each: :mod:`.local_gpu`, :mod:`.local_cpu`, :mod:`.attach`,
:mod:`.gpu_worker` (``spillway worker``), :mod:`.mpi` (``spillway mpi``),
:mod:`.slurm_batch` (``spillway slurm``: the sbatch script, its queue, and a one-node
script run without Slurm) and :mod:`.slurm_jobs` (``spillway.slurm()``: dask-jobqueue's
cluster of Slurm jobs). What they start is decided before any of them runs (:mod:`.plan`,
the :class:`WorkerSpec` of each worker: :mod:`.spec`) and rendered by pure functions:
dask-cuda's keywords and flags (:mod:`.render`), the scheduler's and workers' command
lines (:mod:`.commands`) and the batch seam's job script (:mod:`.batch`, which a batch
system beside Slurm subclasses). The CLI's commands and the notebook's clusters only parse
their arguments and call a launcher.

The names in ``__all__`` are the package's public surface, with the modules the rooms
above use by name (``tests/test_layers.py``'s ``PUBLIC_MODULES``: the launchers an entry
point names, and what every cluster registers); every room above it (workflows, runs, the
notebook clusters, the service, the CLI, and the benchmarks beside them) imports nothing
else of the package (``tests/test_layers.py`` checks it); the modules behind them are free
to move. What they register on every cluster: :mod:`.plugins` (the worker plugin,
:class:`~.plugins.WorkerSetup`), :mod:`.collector` (Python's collector kept out of the
runs) and :mod:`.worker_loss` (a run failed within seconds of losing a worker it depends
on). :mod:`.attach` refuses in one line an address that is no dask scheduler, and
:mod:`.interrupts` keeps the terminal's Ctrl-C from a local cluster's workers, which
:func:`~.closing.closer` then stops at once.
"""

from __future__ import annotations

from .backend import Backend, backend_for
from .closing import close_cluster, close_timeout_s, quiet_logs
from .gpu_worker import DEATH_TIMEOUT_S, TIERED_WORKER, node_plan, run_node
from .plan import HostProbe, LaunchPlan, cuda_stack_installed, plan, ucxx_installed, uses_tiered_store
from .protocol import choose_protocol
from .render import dask_cuda_kwargs, dask_cuda_worker_flags, flag_value, store_data, tls_flags
from .http_server import free_dashboard_address, scheduler_without_http
from .session import Session, open_cluster, plan_when_free, register_plugins, scheduler_workers
from .spec import WorkerSpec, off_node_spec, one_for_all, worker_specs
from .ucx_env import QUIET_UCX, quiet_ucx
from .worker_config import worker_config

__all__ = [
    # a cluster from the options, and its parts
    "Session", "open_cluster", "close_cluster", "close_timeout_s", "register_plugins", "plan_when_free",
    "scheduler_workers", "quiet_logs",
    # the plan, the workers' specs and the backends that start them
    "plan", "HostProbe", "LaunchPlan", "uses_tiered_store", "node_plan", "WorkerSpec", "worker_specs",
    "off_node_spec", "one_for_all", "Backend", "backend_for", "choose_protocol",
    # the specs and the options in the forms other launchers take
    "dask_cuda_kwargs", "dask_cuda_worker_flags", "flag_value", "store_data", "tls_flags", "worker_config",
    "QUIET_UCX", "quiet_ucx", "DEATH_TIMEOUT_S", "TIERED_WORKER",
    # a node's workers under `spillway worker`, what the bench's baseline checks, and what
    # `spillway config` reads of the machine
    "run_node", "ucxx_installed", "cuda_stack_installed",
    # a scheduler without an HTTP server, for a cluster manager that starts its own
    "free_dashboard_address",
    "scheduler_without_http",
]
