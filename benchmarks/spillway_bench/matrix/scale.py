"""How large the matrix's cases are: a projected footprint of ``factor`` times the GPUs'
memory (NVML on the GPU host) or of a small stand-in for CPU workers, and the search for
the smallest size that reaches it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

#: the issue's scale: projected footprint at least this times the GPUs' memory
GPU_FACTOR = 1.3
#: the sizing search stops above the target by at most this share
SIZE_SLACK = 1.02
SEED = 4242


@dataclass(frozen=True)
class Scale:
    """How large the cases are: ``factor`` times ``device_bytes`` of projected footprint."""

    device_bytes: int
    kind: str = "gpu"
    n_workers: int = 2
    #: memory one worker holds before it spills (device limit on GPUs): sets auto chunks
    worker_bytes: int = 4 * 2**30
    factor: float = GPU_FACTOR

    @property
    def target_bytes(self) -> int:
        return math.ceil(self.factor * self.device_bytes)

    def target(self):
        from spillway.workflows.params import Target

        return Target(kind=self.kind, n_workers=self.n_workers, worker_bytes=self.worker_bytes)


def gpu_scale(factor: float = GPU_FACTOR, inventory=None) -> Scale:
    """The GPUs' memory from NVML (the visible GPUs), one worker each, spillway's default
    device limit (80% of a GPU) per worker."""
    from spillway.options.gpus import discover

    inventory = discover() if inventory is None else inventory
    sizes = [g.memory_total for g in inventory.gpus]
    if not sizes:
        raise RuntimeError("no GPU visible: the GPU matrix needs the GPU host")
    return Scale(device_bytes=sum(sizes), kind="gpu", n_workers=len(sizes), worker_bytes=int(0.8 * min(sizes)),
                 factor=factor)


def cpu_scale(device_bytes: int = 48 * 2**20, n_workers: int = 2, factor: float = GPU_FACTOR) -> Scale:
    """A small stand-in for the GPUs' memory, for CPU workers."""
    return Scale(device_bytes=device_bytes, kind="cpu", n_workers=n_workers,
                 worker_bytes=max(2**20, device_bytes // n_workers), factor=factor)


def grow(footprint_of: Callable[[int], int], target: int, start: int) -> int:
    """The smallest size (within :data:`SIZE_SLACK`) whose ``footprint_of`` reaches
    ``target``: footprints grow about linearly with size, so a few proportional steps."""
    size = max(1, start)
    for _ in range(8):
        fp = footprint_of(size)
        if target <= fp <= SIZE_SLACK * target:
            return size
        size = max(1, int(size * target * (1 + (SIZE_SLACK - 1) / 2) / max(1, fp)))
    while footprint_of(size) < target:
        size = int(size * 1.01) + 1
    return size
