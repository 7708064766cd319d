"""The two clusters the bench compares: spillway's, and what a user gets without it
(``LocalCUDACluster(protocol="ucx")`` at dask-cuda's defaults on the same GPUs, or
``distributed.LocalCluster`` on CPU), with spillway's spill counters registered on its
workers to count, changing no setting.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import dask.config

from spillway.options.gpus import Inventory
from spillway.launch import LaunchPlan, open_cluster, ucxx_installed
from spillway.options.settings import Options
from spillway.launch.plugins import WorkerSetup
from spillway.datapath.transfer import transport

#: spillway's settings for speed, used where the user set no value of their own: an RMM
#: pool so buffers (and the CUDA IPC handles UCX caches for them) are reused instead of
#: allocated per chunk, and no dashboard
BENCH_OPTIONS = {"rmm_pool_size": 0.85, "dashboard_address": None}

#: the worker settings that shape transfers, read on a worker of each side
TRANSFER_KEYS = ("distributed.worker.connections.incoming", "distributed.worker.connections.outgoing",
                 "distributed.worker.transfer.message-bytes-limit")


def bench_options(options: Options, kind: str) -> Options:
    """``options`` with :data:`BENCH_OPTIONS` where no source but the defaults set a value
    (the RMM pool only for GPU workers, and only where no other allocator was chosen)."""
    changes = {}
    for key, value in BENCH_OPTIONS.items():
        if options.sources.get(key, "default") != "default":
            continue
        if key == "rmm_pool_size" and (kind != "gpu" or options.rmm_async or options.rmm_managed_memory):
            continue
        changes[key] = value
    return options.replace(**changes) if changes else options


class SpillCounter(WorkerSetup):
    """spillway's worker plugin without its allocator changes: on the baseline it only
    records the worker's kind and counts spilled bytes, leaving dask-cuda's memory
    setup as it is."""

    def _setup_gpu(self, store=None):
        pass


def _worker_transfer(dask_worker=None) -> dict:
    return {key: dask.config.get(key) for key in TRANSFER_KEYS}


def _worker_ucx(dask_worker=None) -> dict:
    """The UCX transports a worker was configured with: environment and dask config."""
    import os

    env = {k: v for k, v in os.environ.items() if k.startswith("UCX_")}
    return {"env": env, "config": dask.config.get("distributed.comm.ucx", default={})}

#: seconds a side waits for the GPUs the previous side's cluster held: a closed cluster's
#: worker processes give their pools back within seconds of their exit
GPUS_BACK_WAIT_S = 60
#: what a GPU may still hold, beyond what it held when the bench started, for a side to start
GPUS_BACK_SLACK = 2 * 2**30


def wait_for_gpus(inventory: Inventory, devices, log, *, wait_s: float = GPUS_BACK_WAIT_S, read=None) -> float:
    """Wait until each GPU of ``devices`` has about the free memory ``inventory`` read at
    the bench's start, for up to ``wait_s`` seconds; returns the seconds waited. A GPU still
    held after that is said with its numbers, and the side starts anyway (its cluster then
    refuses in one line). Without this a side started while the previous side's pools were
    still held took them for its own failure (two H200s, O4's task-method side)."""
    import time

    from spillway.options.gpus import discover

    read = read or discover
    start = {g.index: g.memory_free for g in (inventory.find(d) for d in dict.fromkeys(devices)) if g is not None}
    began = time.monotonic()
    while True:
        now = {g.index: g for g in read().gpus if g.index in start}
        short = {i: g for i, g in now.items() if g.memory_free + GPUS_BACK_SLACK < start[i]}
        waited = time.monotonic() - began
        if not short:
            if waited >= 1:
                log(f"waited {waited:.1f} s for the GPUs the previous cluster held")
            return waited
        if waited >= wait_s:
            log("GPUs still held after %.0f s: %s" % (waited, "; ".join(
                f"GPU {i} {g.memory_free / 1e9:.1f} GB free of {g.memory_total / 1e9:.1f} GB "
                f"({start[i] / 1e9:.1f} GB at the start)" for i, g in short.items())))
            return waited
        time.sleep(0.5)


@contextlib.contextmanager
def spillway_cluster(options: Options, inventory: Inventory | None) -> Iterator[tuple[Any, dict]]:
    with open_cluster(options, inventory=inventory) as session:
        yield session.client, {
            "kind": session.kind,
            "n_workers": session.n_workers,
            "workers_per_gpu": session.plan.workers_per_gpu,
            "protocol": session.plan.protocol,
            "options": {k: v for k, v in options.as_config().items() if v not in (None, False)},
            "ucx_env": _ucx_env(session.client, session.plan.protocol),
            "transport": transport(session.client),
            "worker_transfer": _transfer_settings(session.client),
        }


@contextlib.contextmanager
def baseline_cluster(launch: LaunchPlan, options: Options, changes: dict) -> Iterator[tuple[Any, dict]]:
    from distributed import Client

    notes = []
    if launch.kind == "gpu" and launch.workers_per_gpu > 1:
        # LocalCUDACluster refuses a GPU named twice: what a user of plain dask-cuda runs
        # instead is a scheduler and a `dask cuda worker` per worker, each given its GPU
        with dask_cuda_processes(launch.devices, changes) as (client, described):
            client.register_plugin(SpillCounter())
            described.update(kind=launch.kind, ucx_env=_ucx_env(client, described["protocol"]),
                             transport=transport(client), worker_transfer=_transfer_settings(client))
            yield client, described
        return
    if launch.kind == "gpu":
        from dask_cuda import LocalCUDACluster

        protocol = "ucx"
        if not ucxx_installed():
            protocol = "tcp"
            notes.append("distributed-ucxx is not installed: baseline over TCP")
        kwargs = dict(protocol=protocol, CUDA_VISIBLE_DEVICES=list(launch.devices),
                      n_workers=launch.n_workers, dashboard_address=None,
                      silence_logs=logging.WARNING, **changes)
        cluster = LocalCUDACluster(**kwargs)
        described = f"LocalCUDACluster({', '.join(f'{k}={v!r}' for k, v in kwargs.items() if k != 'silence_logs')})"
    else:
        from distributed import LocalCluster

        protocol = "tcp"
        kwargs = dict(n_workers=launch.n_workers, threads_per_worker=options.threads_per_worker,
                      processes=True, host="127.0.0.1", dashboard_address=None)
        cluster = LocalCluster(silence_logs=logging.WARNING, **kwargs)
        described = f"LocalCluster({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
    with cluster, Client(cluster) as client:
        client.wait_for_workers(launch.n_workers, timeout=120)
        client.register_plugin(SpillCounter())
        yield client, {"kind": launch.kind, "n_workers": launch.n_workers, "protocol": protocol,
                       "cluster": described, "notes": notes, "ucx_env": _ucx_env(client, protocol),
                       "transport": transport(client), "worker_transfer": _transfer_settings(client)}


def _transfer_settings(client) -> dict:
    """The transfer settings as the workers read them (the same on every worker)."""
    return next(iter(client.run(_worker_transfer).values()), {})


def _ucx_env(client, protocol: str) -> dict:
    if protocol != "ucx":
        return {}
    envs = client.run(_worker_ucx)
    return next(iter(envs.values()), {})


#: seconds the plain dask-cuda processes have to start and register
PROCESSES_START_S = 180


def worker_flags(changes: dict) -> list[str]:
    """``dask cuda worker`` flags for the options ``changes`` a workload gives the
    baseline (such as B2's device limit); bytes and fractions as dask-cuda reads them."""
    args = []
    for key, value in changes.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else flag.replace("--", "--no-", 1))
        else:
            args += [flag, str(value)]
    return args


@contextlib.contextmanager
def dask_cuda_processes(devices, changes: dict | None = None, *, protocol: str | None = None,
                        extra_flags: tuple[str, ...] = (), command: tuple[str, ...] = ("cuda", "worker")):
    """Plain dask-cuda started by hand: ``dask scheduler`` and one ``dask cuda worker``
    per entry of ``devices`` (a GPU named once per worker of it), each with
    ``CUDA_VISIBLE_DEVICES`` set to its GPU, protocol ucx where distributed-ucxx is
    installed, dask-cuda's defaults otherwise (``extra_flags``: more worker flags, to
    measure one setting apart). Yields ``(client, description)``. ``command``: the dask
    subcommand of each worker (``worker`` starts CPU workers the same way, for tests)."""
    import os
    import subprocess
    import sys
    import tempfile
    import time

    from distributed import Client

    from spillway.launch import QUIET_UCX

    protocol = protocol or ("ucx" if ucxx_installed() else "tcp")
    notes = [] if protocol == "ucx" else ["distributed-ucxx is not installed: baseline over TCP"]
    # the bench's transfer log length (set in this process's dask config) reaches the
    # processes as their environment, as a user's DASK_ variables would
    length = dask.config.get("distributed.admin.low-level-log-length")
    env = {**os.environ, **QUIET_UCX, "DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH": str(length)}
    flags = worker_flags(changes or {}) + list(extra_flags)
    procs = []
    with tempfile.TemporaryDirectory(prefix="spillway-dask-cuda-") as tmp:
        scheduler_file = os.path.join(tmp, "scheduler.json")
        logs = open(os.path.join(tmp, "processes.log"), "w")
        try:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "dask", "scheduler", "--scheduler-file", scheduler_file,
                 # any free port: UCX's listener does not reuse an address, so 8786 is
                 # refused for a minute after an earlier rig's scheduler closed it
                 "--protocol", protocol, "--port", "0", "--no-dashboard"], env=env, stdout=logs, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + PROCESSES_START_S
            while not os.path.exists(scheduler_file):
                if procs[0].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"dask scheduler did not start: {_tail(logs.name)}")
                time.sleep(0.2)
            commands = []
            for device in devices:
                argv = [*command, "--scheduler-file", scheduler_file, "--protocol", protocol,
                        "--no-dashboard", *flags]
                commands.append(f"CUDA_VISIBLE_DEVICES={device} dask {' '.join(argv)}")
                procs.append(subprocess.Popen([sys.executable, "-m", "dask", *argv],
                                              env={**env, "CUDA_VISIBLE_DEVICES": str(device)},
                                              stdout=logs, stderr=subprocess.STDOUT))
            with Client(scheduler_file=scheduler_file, timeout="60s") as client:
                try:
                    client.wait_for_workers(len(devices), timeout=PROCESSES_START_S)
                except TimeoutError:
                    raise RuntimeError(f"dask cuda workers did not start: {_tail(logs.name)}") from None
                yield client, {"n_workers": len(devices), "protocol": protocol, "notes": notes,
                               "cluster": f"dask scheduler --protocol {protocol}; " + "; ".join(commands)}
        finally:
            for proc in reversed(procs):
                proc.terminate()
            for proc in reversed(procs):
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            logs.close()


def _tail(path: str, lines: int = 5) -> str:
    """The first line that names an error (the cause; a traceback's last lines are often
    only distributed's "failed to start") and the last ``lines`` lines of the log."""
    try:
        with open(path) as f:
            text = f.read().splitlines()
    except OSError:
        return "no log"
    cause = next((line.strip() for line in text if "Error" in line or "error:" in line), None)
    tail = [line.strip() for line in text[-lines:]]
    return " | ".join(([cause] if cause and cause not in tail else []) + tail)
