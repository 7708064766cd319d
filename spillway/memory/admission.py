"""Admission: refuse a workflow whose projected footprint cannot fit the cluster.

Capacity is what the workers can hold across their tiers: device memory up to each
worker's device limit, host memory up to its host tier (the tiered store's host limit;
distributed's memory limit for other stores), and the free space of the filesystem each
worker spills to, less a reserve (:func:`disk_reserve`) that the disk tier must not take
from the machine (its logs, outputs, other users). A run that fits the devices runs as is;
one that fits only with spilling runs and says so; one that fits nowhere is refused before
it starts, in one line naming the footprint, each tier's bytes and their sum, the limit.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace

from spillway import upstream
from spillway.options.errors import AdmissionError
from spillway.options.sizes import format_bytes
from .tier import raw_nbytes


@dataclass(frozen=True)
class Capacity:
    device_bytes: int
    host_bytes: int
    disk_bytes: int
    n_workers: int
    #: the spill filesystems' free bytes, and the reserve kept of them (disk_bytes is the
    #: difference)
    disk_free_bytes: int | None = None
    disk_reserve_bytes: int = 0
    #: what the workers' stores have written to those filesystems, where counted as room
    #: (a check that counts what the cluster holds beside what comes)
    disk_stored_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.device_bytes + self.host_bytes + self.disk_bytes

    def to_json(self) -> dict:
        return {"device_bytes": self.device_bytes, "host_bytes": self.host_bytes,
                "disk_bytes": self.disk_bytes, "n_workers": self.n_workers,
                "disk_free_bytes": self.disk_free_bytes, "disk_reserve_bytes": self.disk_reserve_bytes,
                "disk_stored_bytes": self.disk_stored_bytes}


@dataclass(frozen=True)
class Decision:
    capacity: Capacity
    fits_device: bool
    note: str

    def to_json(self) -> dict:
        return {"capacity": self.capacity.to_json(), "fits_device": self.fits_device, "note": self.note}


GiB = 2**30


def disk_reserve(total: int) -> int:
    """Bytes of a spill filesystem of ``total`` bytes that admission leaves free: a
    twentieth of it, at least 1 GiB and at most 50 GiB."""
    return int(min(50 * GiB, max(GiB, total // 20)))


def spill_directory(dask_worker) -> str:
    """Where the worker's store writes what it spills: the directory of the tiered store's
    first tier below the host (its disk), else the worker's local directory (dask-cuda's
    and distributed's stores spill under it)."""
    from .disk import DiskTier

    for tier in _below(dask_worker.data):
        if isinstance(tier, DiskTier):
            return tier.directory
    return dask_worker.local_directory


def _below(data) -> tuple:
    """The tiers below the host of a tiered store (none for another store)."""
    from .store import TieredStore

    return data.below if isinstance(data, TieredStore) else ()


def worker_capacity(dask_worker) -> dict:
    """One worker's tiers in bytes, and the filesystem it spills to (runs on the worker);
    with the tiered store, what its tiers below the host (``disk``) can take and hold
    (``disk_stored``: their bytes, ``disk_raw``: the values' own, more where they were
    compressed) and the rates the first of them writes and reads values at
    (``disk_write_rate``, ``disk_read_rate``: bytes per second, 0.0 while not known;
    ``disk_write_from``, ``disk_read_from``: "spills" or "probe", :meth:`~.tier.Tier.rates`)."""
    import os

    from .store import TieredStore

    data = dask_worker.data
    host = upstream.worker_memory_limit(dask_worker)
    device = 0
    if isinstance(data, TieredStore):
        # no limit (None) is what the hardware holds: the whole GPU, the machine less the
        # headroom the store keeps free
        device = data.device_limit if data.device_limit is not None else _gpu_memory()
        if data.host_limit is not None:
            host = data.host_limit
        elif data.books is not None:
            host = host or max(0, data.books.available() + data.books.read()[1] - data.books.headroom)
        room = data.host_room
        if room is not None and host:
            # what the machine lets the tier hold now, where that is less than its limit:
            # the graphs admitted past it are told their disk bytes as they will be
            host = min(host, room)
    elif getattr(data, "device_memory_limit", None):
        device = int(data.device_memory_limit)
    directory = spill_directory(dask_worker)
    below = _below(data)
    try:
        free, reserve = _room_below(below) if below else _filesystem_room(*shutil.disk_usage(directory)[:3:2])
        filesystem = os.stat(directory).st_dev
    except OSError:
        free, reserve, filesystem = 0, 0, None
    rates = below[0].rates() if below else {}
    return {"device": int(device), "host": int(host), "disk": max(0, int(free) - reserve), "disk_free": int(free),
            "disk_reserve": int(reserve), "disk_directory": directory, "filesystem": filesystem,
            "disk_stored": int(sum(t.nbytes for t in below)),
            "disk_raw": int(sum(raw_nbytes(t) for t in below)),
            "disk_write_rate": float(rates.get("write", 0.0)), "disk_read_rate": float(rates.get("read", 0.0)),
            "disk_write_from": rates.get("write_from"), "disk_read_from": rates.get("read_from")}


def _filesystem_room(total: int, free: int) -> tuple[int, int]:
    return int(free), disk_reserve(total)


def _room_below(tiers) -> tuple[int, int]:
    """(free, reserve) bytes of the tiers below the host: a disk tier's filesystem free
    bytes (within its own limit) less the reserve kept of each filesystem, counted once
    for disk tiers that share one; another tier's room (none where it knows no bound)."""
    import os

    from .disk import DiskTier

    free, reserve, seen = 0, 0, set()
    for tier in tiers:
        if isinstance(tier, DiskTier):
            total, room = tier.usage()
            device = os.stat(tier.directory).st_dev
            if device in seen and tier.limit is None:
                continue  # the same free bytes, counted already
            free += room if tier.limit is None else min(room, max(0, tier.limit - tier.nbytes))
            if device not in seen:
                seen.add(device)
                reserve += disk_reserve(total)
        else:
            free += tier.room() or 0
    return free, reserve


_GPU_MEMORY: list = []


def _gpu_memory() -> int:
    """Bytes of this worker's GPU (its CUDA_VISIBLE_DEVICES puts it first), read once: the
    workers report their tiers on every heartbeat."""
    if not _GPU_MEMORY:
        from spillway.options.gpus import discover

        inventory = discover()
        _GPU_MEMORY.append(inventory.gpus[0].memory_total if len(inventory) else 0)
    return _GPU_MEMORY[0]


#: the scheduler's handler that answers each worker's tiers from its heartbeats (the
#: capacity plugin's, :mod:`.capacity`): the one source of capacity for admission
CAPACITY = "spillway_capacity"


def cluster_capacity(client) -> Capacity:
    """The cluster's tiers, as admission counts them (:func:`combine`)."""
    return combine(worker_reports(client))


def worker_reports(client) -> dict:
    """Each worker's :func:`worker_capacity` by address, from the scheduler's capacity
    plugin, which holds them from the workers' heartbeats (one call to the scheduler, none
    to the workers); a worker it has no report of, or a scheduler without the plugin (a
    cluster spillway did not start), is asked directly."""
    try:
        answer = client.sync(getattr(client.scheduler, CAPACITY))
    except Exception:  # noqa: BLE001 (no such handler there: the workers are asked)
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("reports"), dict):
        return client.run(worker_capacity)
    reports = dict(answer["reports"])
    if answer.get("missing"):
        reports.update(client.run(worker_capacity, workers=list(answer["missing"])))
    return reports


def combine(per_worker: dict, *, with_stored: bool = False) -> Capacity:
    """The cluster's tiers from each worker's :func:`worker_capacity` (by address).
    Workers of one machine spilling to one filesystem share its free space: it counts
    once. ``with_stored``: the disk also holds what the stores have written to it (for a
    check that counts what the cluster holds beside what comes)."""
    disks: dict = {}
    for addr, cap in per_worker.items():
        disks.setdefault((addr.rsplit(":", 1)[0], cap.get("filesystem")), []).append(cap)
    free = sum(caps[0].get("disk_free", caps[0]["disk"]) for caps in disks.values())
    reserve = sum(caps[0].get("disk_reserve", 0) for caps in disks.values())
    stored = sum(c.get("disk_stored", 0) for caps in disks.values() for c in caps) if with_stored else 0
    disk = sum(max(0, caps[0].get("disk_free", caps[0]["disk"]) - caps[0].get("disk_reserve", 0)
                   + (sum(c.get("disk_stored", 0) for c in caps) if with_stored else 0))
               for caps in disks.values())
    return Capacity(
        device_bytes=sum(c["device"] for c in per_worker.values()),
        host_bytes=sum(c["host"] for c in per_worker.values()),
        disk_bytes=disk,
        n_workers=len(per_worker),
        disk_free_bytes=free,
        disk_reserve_bytes=reserve,
        disk_stored_bytes=stored,
    )


@dataclass(frozen=True)
class DiskTraffic:
    """What a graph past device + host spends on the spill disks: its bytes written there
    once and read back once, shared evenly by the workers, which write and read at once
    (each its own disk, or its share of one); the time is the slowest worker's."""

    #: bytes of values that go to disk (each written once and read back at least once)
    nbytes: int
    n_workers: int
    #: the slowest worker's seconds for its share, its rates and where they come from;
    #: seconds None where no worker knows its rates yet
    seconds: float | None = None
    write_rate: float = 0.0
    read_rate: float = 0.0
    rates_from: str | None = None

    @property
    def share(self) -> int:
        return -(-self.nbytes // max(1, self.n_workers))


def disk_traffic(nbytes: int, per_worker: dict) -> DiskTraffic:
    """The disk traffic of ``nbytes`` past device + host on the workers of
    :func:`worker_capacity` reports (by address). Each worker takes an even share; a
    worker that has no rates (no disk tier, its probe not done) is left out of the time,
    not of the share. Workers of one machine spilling to one filesystem each measured
    their rate while the others spilled too (or probed, all starting at once), so each
    one's share over its own rate is the time of the filesystem's whole part."""
    traffic = DiskTraffic(int(max(0, nbytes)), len(per_worker))
    slowest = None
    for report in per_worker.values():
        write, read = float(report.get("disk_write_rate") or 0), float(report.get("disk_read_rate") or 0)
        if write <= 0 or read <= 0:
            continue
        seconds = traffic.share / write + traffic.share / read
        if slowest is None or seconds > slowest[0]:
            sources = {report.get("disk_write_from"), report.get("disk_read_from")} - {None}
            slowest = (seconds, write, read, " and ".join(sorted(sources)) or None)
    if slowest is None:
        return traffic
    return replace(traffic, seconds=slowest[0], write_rate=slowest[1], read_rate=slowest[2], rates_from=slowest[3])


def admit(workflow: str, footprint, capacity: Capacity) -> Decision:
    """Raise AdmissionError if ``footprint`` exceeds every tier together."""
    need = footprint.total_bytes
    if need > capacity.total_bytes:
        raise AdmissionError(refusal(workflow, need, capacity))
    fits = capacity.device_bytes == 0 or need <= capacity.device_bytes
    note = "fits in device memory" if fits and capacity.device_bytes else (
        f"exceeds device memory ({format_bytes(capacity.device_bytes)}): runs with spilling")
    if not capacity.device_bytes:
        note = "CPU workers"
    return Decision(capacity=capacity, fits_device=fits, note=note)


def refusal(workflow: str, need: int, capacity: Capacity) -> str:
    """The one line of a refused run: the footprint, each tier and their sum, the limit."""
    disk = f"disk {format_bytes(capacity.disk_bytes)}"
    if capacity.disk_free_bytes is not None and capacity.disk_reserve_bytes:
        disk += (f" ({format_bytes(capacity.disk_free_bytes)} free less a reserve of "
                 f"{format_bytes(capacity.disk_reserve_bytes)})")
    return (f"{workflow}: projected footprint {format_bytes(need)} exceeds the cluster's device + host + disk "
            f"capacity {format_bytes(capacity.total_bytes)} (device {format_bytes(capacity.device_bytes)} + "
            f"host tier {format_bytes(capacity.host_bytes)} + {disk}, {capacity.n_workers} "
            f"worker{'s' if capacity.n_workers != 1 else ''})")
