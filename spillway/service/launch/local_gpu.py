"""Local GPU cluster: dask-cuda's LocalCUDACluster, one worker per selected GPU."""

from __future__ import annotations

from ..options import Options
from .http_server import cluster_class, dashboard_kwargs
from .plan import LaunchPlan
from .render import dask_cuda_kwargs, store_data
from .spec import HostFacts, WorkerSpec, one_for_all, worker_specs
from .worker_config import worker_config


def cluster_kwargs(options: Options, plan: LaunchPlan, facts: HostFacts | None = None) -> dict:
    """LocalCUDACluster keywords: a pure function of the options (the scheduler's
    settings), the plan and the host's ``facts`` (this machine's when not given), tested
    without a GPU."""
    return specs_kwargs(options, worker_specs(options, plan, facts))


def specs_kwargs(options: Options, specs: tuple[WorkerSpec, ...]) -> dict:
    """LocalCUDACluster keywords for workers ``specs`` (one per GPU) and the scheduler of
    ``options``."""
    spec = one_for_all(specs)
    kwargs = dict(
        CUDA_VISIBLE_DEVICES=[s.device for s in specs],
        n_workers=len(specs),
        threads_per_worker=spec.threads,
        interface=spec.interface,
        host=options.host,
        scheduler_port=options.scheduler_port,
        **dashboard_kwargs(options),
        security=spec.security,
        silence_logs=False,
        **dask_cuda_kwargs(spec),
    )
    if spec.interface is not None:
        kwargs.pop("host")
    if spec.tiered:
        kwargs["data"] = store_data(spec)
    return kwargs


def start(options: Options, plan: LaunchPlan, specs: tuple[WorkerSpec, ...]):
    import logging

    import dask.config
    from dask_cuda import LocalCUDACluster

    kwargs = specs_kwargs(options, specs)
    kwargs["silence_logs"] = logging.WARNING
    with dask.config.set(worker_config(options, tiered_store=specs[0].tiered)):
        return cluster_class(LocalCUDACluster, kwargs)(**kwargs)
