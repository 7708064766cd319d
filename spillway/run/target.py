"""The workflow target of a running cluster: worker kind, count and memory each."""

from __future__ import annotations

from collections import Counter

from spillway.workflows.params import Target

from spillway.datapath.transfer import worker_gpu


def target_of(session) -> Target:
    """The workflow target of a running cluster: worker kind, count and memory each."""
    from spillway.launch import scheduler_workers

    info = scheduler_workers(session.client)
    limits = [w.get("memory_limit") or 0 for w in info.values()]
    if session.kind == "gpu":
        device = session.client.run(_device_limit)
        # a worker without a device limit has its GPU, shared with the other workers of it
        sharing = Counter(d["gpu"] for d in device.values())
        limits = [d["limit"] // (sharing[d["gpu"]] if d["whole_gpu"] and d["gpu"] else 1)
                  for d in device.values() if d["limit"]] or limits
    per_worker = min(limits) if limits and min(limits) > 0 else 4 * 2**30
    # the workers up now: a cluster that scales has more or fewer than it started with
    return Target(kind=session.kind, n_workers=len(info), worker_bytes=int(per_worker),
                  workers=tuple(sorted(info)))


def _device_limit(dask_worker):
    """The worker's device limit (its store's), else its whole GPU, and which GPU it is
    (runs on the worker)."""
    from spillway.options.gpus import discover
    from spillway.memory.admission import worker_capacity

    device = worker_capacity(dask_worker)["device"]
    if device:
        return {"limit": device, "gpu": worker_gpu(), "whole_gpu": False}
    inventory = discover()  # honours CUDA_VISIBLE_DEVICES: GPU 0 is this worker's
    return {"limit": inventory.gpus[0].memory_total if len(inventory) else None, "gpu": worker_gpu(),
            "whole_gpu": True}
