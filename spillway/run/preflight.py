"""Admission before a GPU cluster starts.

A run that no tier can hold is refused by :func:`~.memory.admission.admit` on the running
cluster too, but by then the workers have taken their RMM pools and pinned arenas: on one
H100 that is 10-20 s of start-up, and the GPUs of a shared host held meanwhile. The worker
specs already say what each worker's tiers hold (:mod:`.launch.spec`), so the same check
runs on them first, in the time it takes to build the graph (no chunk is made). The check
on the running cluster stays: it reads what the workers really have.

The footprint comes from the parameters where the workflow can say it so (tsqr and svd,
whose graphs take the longest to build), else from the graph built on NumPy metas: the
same tasks and chunks, but nothing here imports CuPy or makes a CUDA context, so a
refusal takes no GPU memory and no CUDA start-up.
"""

from __future__ import annotations

import shutil
import tempfile

from spillway.workflows.params import Target

from spillway.cluster.launch import WorkerSpec
from spillway.cluster.memory.admission import Capacity, admit, disk_reserve


def planned(specs: tuple[WorkerSpec, ...], device_memory: tuple[int, ...], local_directory: str | None,
            host_total: int) -> tuple[Target, Capacity]:
    """The workflow target and the capacity of the GPU workers ``specs`` (one per worker,
    ``device_memory`` their GPU's bytes each, the share of each where workers share a
    GPU), as the running workers will report them: the device limit, else the GPU; the
    host tier, else the machine less the headroom the store keeps, shared out; the disk
    where they spill, once, less its reserve."""
    from spillway.cluster.memory.growth import headroom_for

    devices = [s.device_memory_limit if isinstance(s.device_memory_limit, int) else m
               for s, m in zip(specs, device_memory, strict=True)]
    n = max(1, len(specs))
    hosts = [s.host_limit if s.host_limit is not None else max(0, host_total - headroom_for(host_total)) // n
             for s in specs]
    try:
        usage = shutil.disk_usage(local_directory or tempfile.gettempdir())
        free, reserve = int(usage.free), disk_reserve(usage.total)
    except OSError:
        free, reserve = 0, 0
    capacity = Capacity(device_bytes=sum(devices), host_bytes=sum(hosts), disk_bytes=max(0, free - reserve),
                        n_workers=len(specs), disk_free_bytes=free, disk_reserve_bytes=reserve)
    target = Target(kind="gpu", n_workers=len(specs), worker_bytes=min(devices) if devices else 0,
                    chunk_backend="numpy")
    return target, capacity


def refuse_before_start(options, workflow: str, params: dict) -> None:
    """Raise :class:`~.errors.AdmissionError` where the GPU cluster ``options`` would start
    cannot hold ``workflow`` (its parameters' bytes, then its projected footprint); nothing
    for attached or CPU clusters, whose capacity is read once they run."""
    from spillway import workflows

    from spillway.cluster.gpus import discover
    from spillway.cluster.launch import HostProbe, plan, worker_specs
    from spillway.cluster.memory.growth import host_total

    if options.attach:
        return
    launch = plan(options, discover(), HostProbe.here())
    if launch.kind != "gpu" or not launch.device_memory:
        return
    specs = worker_specs(options, launch)
    target, capacity = planned(specs, launch.device_memory, options.local_directory, host_total())
    projected = workflows.get(workflow).projected(params, target, None,
                                                  fits=lambda floor: admit(workflow, floor, capacity))
    admit(workflow, projected, capacity)
