"""Local GPU cluster: dask-cuda's LocalCUDACluster, ``workers-per-gpu`` workers on each
selected GPU.

LocalCUDACluster starts one worker per entry of its ``CUDA_VISIBLE_DEVICES`` and refuses
a GPU named twice ("Can not scale beyond visible devices": it names each worker by its
GPU). Where workers share a GPU, :func:`cluster_type` is LocalCUDACluster with one
change: its workers are named by their place in the plan (``<gpu>-<k>``), and each
worker's spec is the one dask-cuda builds for its GPU (its ``CUDA_VISIBLE_DEVICES``
starting at that GPU, the RMM and CPU-affinity plugins of that GPU, the UCX config), so
the workers of one GPU are started exactly as dask-cuda starts a worker of it. With one
worker per GPU, the default, the cluster is dask-cuda's own class, as run on the GPU
hosts; the subclass has not yet run on one.
"""

from __future__ import annotations

from .. import upstream
from spillway.options.settings import Options
from .http_server import cluster_class, dashboard_kwargs
from .plan import LaunchPlan
from .render import dask_cuda_kwargs, store_data
from .spec import WorkerSpec, one_for_all
from .worker_config import carry_in_spec, worker_config


def worker_names(devices: list) -> list:
    """The name of each worker of ``devices`` (one entry per worker, a GPU repeated for
    each of its workers): the GPU where it has one worker, as dask-cuda names them, else
    ``<gpu>-<k>`` for its k-th worker, as dask-cuda's CUDAWorker names the workers of one
    command."""
    if len(set(devices)) == len(devices):
        return list(devices)
    seen: dict = {}
    names = []
    for device in devices:
        k = seen[device] = seen.get(device, -1) + 1
        names.append(f"{device}-{k}")
    return names


def specs_kwargs(options: Options, specs: tuple[WorkerSpec, ...]) -> dict:
    """LocalCUDACluster keywords for workers ``specs`` (one per worker, in the plan's
    order) and the scheduler of ``options``; where workers share a GPU, keywords of
    :func:`cluster_type`, with ``worker_devices`` (the GPU of each worker) beside
    ``CUDA_VISIBLE_DEVICES`` (each GPU once)."""
    spec = one_for_all(specs)
    devices = [s.device for s in specs]
    kwargs = dict(
        CUDA_VISIBLE_DEVICES=list(dict.fromkeys(devices)),
        n_workers=len(specs),
        threads_per_worker=spec.threads,
        interface=spec.interface,
        host=options.host,
        scheduler_port=options.scheduler_port,
        **dashboard_kwargs(options),
        security=spec.dask_security,
        silence_logs=False,
        **dask_cuda_kwargs(spec),
    )
    if spec.interface is not None:
        kwargs.pop("host")
    if spec.tiered:
        kwargs["data"] = store_data(spec)
    if len(set(devices)) < len(devices):
        # dask-cuda's own class where each GPU has one worker: the subclass only where
        # workers share a GPU
        kwargs["worker_devices"] = devices
    return kwargs


_classes: dict = {}


def cluster_type():
    """LocalCUDACluster whose workers may share a GPU (built on first use, so importing
    this module imports no GPU library)."""
    if "cluster" not in _classes:
        from dask_cuda import LocalCUDACluster

        _classes["cluster"] = shared_gpu_cluster(LocalCUDACluster)
    return _classes["cluster"]


def shared_gpu_cluster(base: type) -> type:
    """``base`` (LocalCUDACluster) taking ``worker_devices``."""

    class SharedGPUCluster(base):
        """LocalCUDACluster taking ``worker_devices``: the GPU of each worker, a GPU
        named once per worker it holds."""

        def __init__(self, *args, worker_devices, **kwargs):
            # before dask-cuda's __init__, which scales to n_workers through new_worker_spec
            self.worker_devices = list(worker_devices)
            self.worker_names = worker_names(self.worker_devices)
            super().__init__(*args, **kwargs)

        def new_worker_spec(self):
            free = [i for i, name in enumerate(self.worker_names) if name not in self.worker_spec]
            if not free:
                raise ValueError("Can not scale beyond the planned workers", self.worker_names)
            device = self.worker_devices[free[0]]
            # dask-cuda's spec of the first worker of ``device``
            spec = upstream.cuda_worker_spec(self, base, device)
            visible = upstream.spec_visible_devices(spec)
            if visible.split(",")[0] != str(device):
                raise RuntimeError(f"dask-cuda gave the worker of GPU {device} CUDA_VISIBLE_DEVICES={visible}: "
                                   "this dask-cuda builds its workers differently; use workers-per-gpu 1")
            return {self.worker_names[free[0]]: spec}

    SharedGPUCluster.__module__, SharedGPUCluster.__qualname__ = __name__, "SharedGPUCluster"
    return SharedGPUCluster


class LocalGPU:
    """Backend of GPU plans: dask-cuda's LocalCUDACluster (or :func:`cluster_type` where
    workers share a GPU) with one worker of each of ``specs``; the plan itself is in them."""

    def start(self, options: Options, launch: LaunchPlan, specs: tuple[WorkerSpec, ...]):
        import logging

        import dask.config

        kwargs = specs_kwargs(options, specs)
        kwargs["silence_logs"] = logging.WARNING
        if "worker_devices" in kwargs:
            base = cluster_type()
        else:
            from dask_cuda import LocalCUDACluster as base
        config = worker_config(options, tiered_store=specs[0].tiered)
        with dask.config.set(config):
            cluster = upstream.keeping_restarted_workers(cluster_class(base, kwargs))(**kwargs)
        carry_in_spec(cluster, config)
        return cluster
