"""Admission: refuse a workflow whose projected footprint cannot fit the cluster.

Capacity is what the workers can hold across their tiers: device memory up to each
worker's device limit, host memory up to its host limit, and the free disk of its local
directory. A run that fits the devices runs as is; one that fits only with spilling runs
and says so; one that fits nowhere is refused before it starts, with both numbers.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from ..errors import AdmissionError
from ..sizes import format_bytes


@dataclass(frozen=True)
class Capacity:
    device_bytes: int
    host_bytes: int
    disk_bytes: int
    n_workers: int

    @property
    def total_bytes(self) -> int:
        return self.device_bytes + self.host_bytes + self.disk_bytes

    def to_json(self) -> dict:
        return {"device_bytes": self.device_bytes, "host_bytes": self.host_bytes,
                "disk_bytes": self.disk_bytes, "n_workers": self.n_workers}


@dataclass(frozen=True)
class Decision:
    capacity: Capacity
    fits_device: bool
    note: str

    def to_json(self) -> dict:
        return {"capacity": self.capacity.to_json(), "fits_device": self.fits_device, "note": self.note}


def worker_capacity(dask_worker) -> dict:
    """One worker's tiers in bytes (runs on the worker)."""
    from .store import TieredStore

    data = dask_worker.data
    host = dask_worker.memory_manager.memory_limit or 0
    device = 0
    if isinstance(data, TieredStore):
        # no limit (None) is what the hardware holds: the whole GPU, the machine less the
        # headroom the store keeps free
        device = data.device_limit if data.device_limit is not None else _gpu_memory()
        if data.host_limit is not None:
            host = data.host_limit
        elif data.books is not None:
            host = host or max(0, data.books.available() + data.books.read()[1] - data.books.headroom)
    elif getattr(data, "device_memory_limit", None):
        device = int(data.device_memory_limit)
    try:
        disk = shutil.disk_usage(dask_worker.local_directory).free
    except OSError:
        disk = 0
    return {"device": int(device), "host": int(host), "disk": int(disk)}


def _gpu_memory() -> int:
    """Bytes of this worker's GPU (its CUDA_VISIBLE_DEVICES puts it first)."""
    from ..gpus import discover

    inventory = discover()
    return inventory.gpus[0].memory_total if len(inventory) else 0


def cluster_capacity(client) -> Capacity:
    per_worker = client.run(worker_capacity)
    # workers on one machine share its disk: count each local directory's free space once
    disks = {}
    for addr, cap in per_worker.items():
        disks[addr.rsplit(":", 1)[0]] = cap["disk"]
    return Capacity(
        device_bytes=sum(c["device"] for c in per_worker.values()),
        host_bytes=sum(c["host"] for c in per_worker.values()),
        disk_bytes=sum(disks.values()),
        n_workers=len(per_worker),
    )


def admit(workflow: str, footprint, capacity: Capacity) -> Decision:
    """Raise AdmissionError if ``footprint`` exceeds every tier together."""
    need = footprint.total_bytes
    if need > capacity.total_bytes:
        raise AdmissionError(
            f"{workflow}: projected footprint {format_bytes(need)} exceeds the cluster's "
            f"device + host + disk capacity {format_bytes(capacity.total_bytes)} "
            f"({format_bytes(capacity.device_bytes)} + {format_bytes(capacity.host_bytes)} + "
            f"{format_bytes(capacity.disk_bytes)})"
        )
    fits = capacity.device_bytes == 0 or need <= capacity.device_bytes
    note = "fits in device memory" if fits and capacity.device_bytes else (
        f"exceeds device memory ({format_bytes(capacity.device_bytes)}): runs with spilling")
    if not capacity.device_bytes:
        note = "CPU workers"
    return Decision(capacity=capacity, fits_device=fits, note=note)
