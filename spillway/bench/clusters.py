"""The two clusters the bench compares, and the settings each side gets.

The baseline is what a user gets without spillway: ``LocalCUDACluster(protocol="ucx")``
at dask-cuda's defaults on the same GPUs, or ``distributed.LocalCluster`` with the same
number of workers on CPU. Only the dashboard is off on both sides, and the transfer log
is made long enough to hold a whole run (:mod:`.harness`). spillway's spill counters are
registered on the baseline's workers too (:class:`SpillCounter`); they only count, they
change no setting.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import dask.config

from spillway.service.gpus import Inventory
from spillway.service.launch import LaunchPlan, open_cluster
from spillway.service.launch.plan import ucxx_installed
from spillway.service.options import Options
from spillway.service.plugins import WorkerSetup
from spillway.service.transfer import transport

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

@contextlib.contextmanager
def spillway_cluster(options: Options, inventory: Inventory | None) -> Iterator[tuple[Any, dict]]:
    with open_cluster(options, inventory=inventory) as session:
        yield session.client, {
            "kind": session.kind,
            "n_workers": session.n_workers,
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
