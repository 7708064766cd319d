"""Local CPU cluster: distributed's LocalCluster with NumPy chunks."""

from __future__ import annotations

import logging

from .. import upstream
from spillway.options.settings import Options
from .http_server import cluster_class, dashboard_kwargs
from .plan import LaunchPlan
from .spec import WorkerSpec


def cluster_kwargs(options: Options, plan: LaunchPlan) -> dict:
    kwargs = dict(
        n_workers=plan.n_workers,
        threads_per_worker=options.threads_per_worker,
        processes=True,
        memory_limit=options.memory_limit,
        local_directory=options.local_directory,
        protocol=plan.protocol,
        interface=options.interface,
        host=options.host,
        scheduler_port=options.scheduler_port,
        **dashboard_kwargs(options),
        security=options.dask_security,
        silence_logs=logging.WARNING,
    )
    if options.interface is not None:
        kwargs.pop("host")
    return kwargs


class LocalCPU:
    """Backend of CPU plans: ``plan.n_workers`` worker processes of distributed's
    LocalCluster (no worker specs: those are GPU workers')."""

    def start(self, options: Options, launch: LaunchPlan, specs: tuple[WorkerSpec, ...]):
        import dask.config
        from distributed import LocalCluster

        from .worker_config import carry_in_spec, worker_config

        config = worker_config(options, tiered_store=False, gpu=False)
        # each nanny hands the config of the moment it is built to its worker process
        with dask.config.set(config):
            kwargs = cluster_kwargs(options, launch)
            cluster = upstream.keeping_restarted_workers(cluster_class(LocalCluster, kwargs))(**kwargs)
        carry_in_spec(cluster, config)
        return cluster
