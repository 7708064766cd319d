"""What a run is refused for before its cluster starts: bad parameters, an output that
cannot be written, and (on GPUs) admission.

Parameters are checked on the workers the options plan, so that chunks larger than the
array or a graph past its limits stop the run in a second, not after a cluster has
started (the running cluster checks them again, on its real workers).

A run that no tier can hold is refused by :func:`~spillway.memory.admission.admit` on the running
cluster too, but by then the workers have taken their RMM pools and pinned arenas: on one
H100 that is 10-20 s of start-up, and the GPUs of a shared host held meanwhile. The worker
specs already say what each worker's tiers hold (:mod:`~spillway.launch.spec`), so the same check
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

from spillway.launch import WorkerSpec
from spillway.memory.admission import Capacity, admit, disk_reserve


def planned(specs: tuple[WorkerSpec, ...], device_memory: tuple[int, ...], local_directory: str | None,
            host_total: int) -> tuple[Target, Capacity]:
    """The workflow target and the capacity of the GPU workers ``specs`` (one per worker,
    ``device_memory`` their GPU's bytes each, the share of each where workers share a
    GPU), as the running workers will report them: the device limit, else the GPU; the
    host tier, else the machine less the headroom the store keeps, shared out; the disk
    where they spill, once, less its reserve."""
    from spillway.memory.growth import headroom_for

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


def most_here(n_workers: int, local_directory: str | None, host_memory: int) -> Capacity:
    """What CPU workers of this machine could hold at most: ``host_memory`` between them,
    and the disk they spill to less its reserve."""
    try:
        usage = shutil.disk_usage(local_directory or tempfile.gettempdir())
        free, reserve = int(usage.free), disk_reserve(usage.total)
    except OSError:
        free, reserve = 0, 0
    return Capacity(device_bytes=0, host_bytes=host_memory, disk_bytes=max(0, free - reserve), n_workers=n_workers,
                    disk_free_bytes=free, disk_reserve_bytes=reserve)


def cpu_target(options, launch, host) -> Target:
    """The workflow target of the CPU workers ``launch`` plans, each worker's memory as
    distributed will give it (``auto``: the host's memory shared by threads, as distributed's
    ``parse_memory_limit`` does; no limit counts as :func:`~.target.target_of` counts it)."""
    limit = options.memory_limit
    if limit == "auto":
        per_worker = int(host.host_memory * min(1.0, options.threads_per_worker / max(1, host.cpu_count)))
    elif isinstance(limit, float):
        per_worker = int(limit * host.host_memory)
    else:
        per_worker = int(limit)
    return Target(kind="cpu", n_workers=launch.n_workers, worker_bytes=per_worker or 4 * 2**30)


def refuse_before_start(options, workflow: str, params: dict, output: str | None = None) -> str | None:
    """Check a run of ``workflow`` before its cluster starts, as far as the values alone
    show it; returns ``output`` made absolute.

    Every value, then the parameters together on the workers the options plan (chunks
    larger than the array, a shape of the wrong dimensions, a graph past its limits, an
    input store that is not there) raise :class:`~spillway.options.errors.ParamError`; an output that
    cannot be written, or would not fit its disk, too. A GPU cluster that cannot hold the
    run raises :class:`~spillway.options.errors.AdmissionError` (its parameters' bytes, then its projected
    footprint). Attached clusters are checked value by value only: their workers are read
    once connected, which starts nothing."""
    from spillway import workflows
    from spillway.workflows.outputs import check_path, check_space

    from spillway.options.errors import ParamError
    from spillway.options.gpus import discover
    from spillway.launch import HostProbe, plan, worker_specs
    from spillway.memory.growth import host_total

    spec = workflows.get(workflow)
    spec.check_values(params)
    if output is not None:
        output = check_path(output)
    if options.attach:
        return output
    host = HostProbe.here()
    # sized on the GPUs' totals: whether they are free now is open_cluster's to wait for
    launch = plan(options, discover(), host, gpus_free=False)
    fits = capacity = None
    if launch.kind == "gpu" and launch.device_memory:
        specs = worker_specs(options, launch)
        target, capacity = planned(specs, launch.device_memory, options.local_directory, host_total())
        fits = lambda floor: admit(workflow, floor, capacity)  # noqa: E731
    elif launch.kind == "gpu":
        return output  # GPUs of unknown memory: the running workers say what they hold
    else:
        target = cpu_target(options, launch, host)
        # the most any CPU workers here could hold (the machine's memory and its disk): a
        # size past it is refused for that, in bytes, before the other checks speak; the
        # running workers' own capacity is checked once they run
        limit = options.memory_limit
        # a size per worker is what each will hold; auto, a fraction or none are bounded by
        # the machine (distributed works them out per worker)
        host_bytes = (limit * launch.n_workers if isinstance(limit, int) and limit > 0
                      else host.host_memory)
        bound = most_here(launch.n_workers, options.local_directory, host_bytes)
        fits = lambda floor: admit(workflow, floor, bound)  # noqa: E731
    validated = spec.validate(params, target, fits=fits)
    built = None
    if output is not None:
        built = spec.build(validated, target)
        if built.array is None:
            raise ParamError(f"output: {workflow} has no array result to write (its result is a summary)")
        check_space(output, int(built.array.nbytes))
    if capacity is not None:  # GPU workers, whose tiers the specs say
        if built is not None:
            projected = built.footprint
        elif spec.project is not None:
            projected = spec.project(validated, target)
        else:
            projected = spec.build(validated, target).footprint
        admit(workflow, projected, capacity)
    return output
