"""Command lines of dask's scheduler and workers, rendered from the one options object.

Batch scripts and the MPI launcher start the scheduler and workers as separate processes
(``dask scheduler``, ``spillway worker`` or ``dask cuda worker``, ``dask worker``) instead
of a local cluster, so the cluster settings have to travel as their flags. These pure
functions render them: the scheduler's and CPU workers' from the options, ``spillway
worker``'s as the options themselves (the node resolves its workers' spec from them), and
``dask cuda worker``'s from the workers' spec (:mod:`.spec`, rendered by :mod:`.render`).
"""

from __future__ import annotations

import ipaddress

from spillway.options.settings import OPTIONS, Options
from .gpu_worker import DEATH_TIMEOUT_S
from .protocol import choose_protocol
from .render import dask_cuda_worker_flags, flag_value, tls_flags
from .spec import WorkerSpec
from .ucx_env import QUIET_UCX
from .worker_config import worker_config


def protocol(options: Options, *, gpu: bool, n_workers: int) -> str:
    """The transport of a cluster started on nodes this process cannot look at: decided
    as a local plan decides it, with distributed-ucxx taken as installed there (the GPU
    extras always install it on the nodes)."""
    return choose_protocol(options.protocol, gpu=gpu, n_workers=n_workers, have_ucxx=True)[0]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _tls(options: Options) -> list[str]:
    return tls_flags(options.tls_ca_file, options.tls_cert, options.tls_key)


def _where(options: Options, *, multi_node: bool) -> list[str]:
    """Interface or host to listen on. A loopback host cannot be reached from other
    nodes, so across nodes it is left out and dask listens on the node's address."""
    if options.interface:
        return ["--interface", options.interface]
    if multi_node and is_loopback(options.host):
        return []
    return ["--host", options.host]


def scheduler_args(options: Options, *, scheduler_file: str, protocol: str, multi_node: bool) -> list[str]:
    """Flags of ``dask scheduler``."""
    args = ["--scheduler-file", scheduler_file, "--protocol", protocol]
    args += _where(options, multi_node=multi_node)
    args += ["--port", str(options.scheduler_port)]
    if options.dashboard_address:
        args += ["--dashboard-address", options.dashboard_address]
    else:
        args += ["--no-dashboard"]
    return args + _tls(options)


def gpu_worker_args(spec: WorkerSpec, *, scheduler_file: str) -> list[str]:
    """Flags of ``dask cuda worker`` for workers of ``spec`` (dask-cuda's store): one
    worker process per GPU the task can see."""
    return (["--scheduler-file", scheduler_file, "--death-timeout", str(DEATH_TIMEOUT_S)]
            + dask_cuda_worker_flags(spec))


#: the options a node's GPU workers are built from (``spillway worker``), as declared
#: (``worker=True``); the scheduler's and the client's (host, port, dashboard, devices) are
#: not theirs
WORKER_OPTIONS = tuple(o for o in OPTIONS if o.worker)


def option_flags(options: Options, declared=WORKER_OPTIONS) -> list[str]:
    """``spillway`` flags that set each ``declared`` option to its value in ``options``,
    unset values included (``none``), so nothing is left to the node's own config."""
    args = []
    for o in declared:
        value = o.as_config(getattr(options, o.name))
        if o.switch:
            args.append(o.flag if value else f"--no-{o.key}")
        else:
            args += [o.flag, "none" if value is None else flag_value(value)]
    return args


def spillway_worker_args(options: Options, *, scheduler_file: str | None = None, scheduler_address: str | None = None,
                         protocol: str, name: str | None = None) -> list[str]:
    """Arguments of ``spillway worker``: one worker per GPU the task can see, built like
    the local GPU cluster's (dask-cuda's set-up, spillway's tiered store), attached by the
    scheduler's file (a batch script's) or its address (a cluster manager's, which also
    names the workers: ``name``, ``name-0``, ``name-1``, ... with several)."""
    where = (["--scheduler-file", scheduler_file] if scheduler_file is not None
             else ["--scheduler-address", scheduler_address])
    return (["worker", *where, "--protocol", protocol, "--death-timeout", str(DEATH_TIMEOUT_S)]
            + (["--name", name] if name is not None else []) + option_flags(options))


def cpu_worker_args(options: Options, *, scheduler_file: str | None = None, scheduler_address: str | None = None,
                    protocol: str, n_workers: int, name: str | None = None) -> list[str]:
    """Arguments of ``dask worker``: ``n_workers`` processes with NumPy chunks, attached by
    the scheduler's file or its address (``dask worker`` takes that as its first argument),
    named ``name`` (``name-0``, ``name-1``, ... with several) where given."""
    where = ["--scheduler-file", scheduler_file] if scheduler_file is not None else [scheduler_address]
    args = [*where, *(["--name", name] if name is not None else []), "--protocol", protocol,
            "--nworkers", str(n_workers),
            "--nthreads", str(options.threads_per_worker),
            "--memory-limit", flag_value(options.memory_limit),
            "--death-timeout", str(DEATH_TIMEOUT_S)]
    if options.interface:
        args += ["--interface", options.interface]
    if options.local_directory is not None:
        args += ["--local-directory", options.local_directory]
    return args + _tls(options)


def client_args(options: Options, *, scheduler_file: str) -> list[str]:
    """Flags of ``spillway run`` attaching to the job's scheduler."""
    return ["--scheduler-file", scheduler_file] + _tls(options)


def worker_environment(options: Options) -> dict[str, str]:
    """The workers' dask config (:func:`.worker_config.worker_config`) as
    ``DASK_`` environment variables, for worker processes started by a batch script.
    Those of dask's own commands keep their store; ``spillway worker`` sets the tiered
    store's config itself, from the same options."""
    return {"DASK_" + key.upper().replace(".", "__").replace("-", "_"): str(value)
            for key, value in worker_config(options, tiered_store=False, gpu=not options.cpu).items()}


def ucx_environment(options: Options) -> dict[str, str]:
    """Environment for the scheduler and client when the workers talk UCX: they create
    a CUDA context before UCX starts so UCX can move device buffers to and from them;
    and every process leaves out UCX's warning about the variable ucxx sets for older
    UCX (:mod:`.ucx_env`)."""
    env = {"DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT": "True", **QUIET_UCX}
    if options.nvlink:
        env["DASK_DISTRIBUTED_UCXX__NVLINK"] = "True"
    return env
