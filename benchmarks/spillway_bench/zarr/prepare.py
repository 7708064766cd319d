"""What a Zarr bench run is, fixed before it starts: the store's shape at each size, the
targets, and the checks that the stores fit the disk and the workers' memory."""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from spillway.options.errors import ParamError
from spillway.options.gpus import Inventory
from spillway.memory.growth import host_total
from spillway.options.settings import Options
from spillway.options.sizes import format_bytes

from .. import ceilings

#: (grid, days) by size: one chunk is 365 days of the grid
SCALES = {
    "tiny": ((73, 144), 4 * 365),
    "small": ((721, 1440), 8 * 365),
    "full": ((721, 1440), 66 * 365),  # 100.1 GB
}
CHUNK_DAYS = 365
DTYPE = "float32"
#: the issue's targets
CACHED_TARGET_GBPS = 10.0
COLD_TARGET = 0.7
DECODE_TARGET_GBPS = 5.0
#: the values' precision (module docstring)
QUANTUM = 1e-3
#: the zstd store: an inner chunk (one zstd frame) is a day's rows, cut into as few
#: equal bands as keep it within this size: a 0.25 degree day (4.2 MB) is 7 bands of 103
#: rows (0.6 MB), so a shard is 2555 frames, which nvCOMP decodes in one batch; each band
#: is a contiguous slab of the shard, decoded in place
ZSTD_FRAME_BYTES = 2**20
STORES = ("uncompressed", "zstd")
#: share of the workers' memory the store may take (it is held whole once read), and
#: of the free disk space
MEMORY_SHARE = {"gpu": 0.6, "cpu": 0.3}
DISK_SHARE = 0.9
MEASURES = ("write", "cold_read", "cached_read")


@dataclass(frozen=True)
class ZarrRun:
    options: Options
    kind: str
    devices: tuple
    inventory: Inventory | None
    scale: str
    runs: int
    timeout: float
    directory: str
    label: str | None = None
    measure_ceilings: Callable = field(default=ceilings.measure)

    @property
    def shape(self) -> tuple[int, int, int]:
        (lat, lon), days = SCALES[self.scale]
        return (days, lat, lon)

    @property
    def chunks(self) -> tuple[int, int, int]:
        return (CHUNK_DAYS, *self.shape[1:])

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(DTYPE).itemsize

    @property
    def chunk_bytes(self) -> int:
        return math.prod(self.chunks) * np.dtype(DTYPE).itemsize

    @property
    def zstd_inner(self) -> tuple[int, int, int]:
        """The zstd store's inner chunk (see ZSTD_FRAME_BYTES)."""
        _, lat, lon = self.shape
        row = lon * np.dtype(DTYPE).itemsize
        bands = next((k for k in range(1, lat + 1) if lat % k == 0 and (lat // k) * row <= ZSTD_FRAME_BYTES), lat)
        return (1, lat // bands, lon)


def prepare_zarr(options: Options, *, sizes: str = "auto", runs: int = 3, timeout: float = 900,
                 label: str | None = None, inventory: Inventory | None = None,
                 no_ceilings: bool = False) -> ZarrRun:
    """Check the request and fix the run: one-line errors before anything starts."""
    from ..suite import checked_launch

    label, inventory, launch, options, scale = checked_launch(
        options, sizes=sizes, runs=runs, label=label, inventory=inventory,
        no_attach="the Zarr bench measures this machine's disk", scales=SCALES)
    directory = options.local_directory or tempfile.gettempdir()
    zarr_run = ZarrRun(options=options, kind=launch.kind, devices=tuple(launch.devices), inventory=inventory,
                    scale=scale, runs=runs, timeout=timeout, directory=directory, label=label,
                    **({"measure_ceilings": ceilings.not_measured} if no_ceilings else {}))
    free = shutil.disk_usage(directory).free
    # both stores lie on the disk at once; the zstd one is counted as large as the other
    if 2 * zarr_run.nbytes > DISK_SHARE * free:
        raise ParamError(f"sizes: the {scale} stores take up to {format_bytes(2 * zarr_run.nbytes)}, more than "
                         f"{DISK_SHARE:.0%} of the {format_bytes(free)} free in {directory} (--local-directory)")
    if launch.kind == "gpu":
        memory = sum(launch.device_memory)
        where = f"the {len(launch.gpus)} GPUs' {format_bytes(memory)}"
    else:
        memory = host_total()
        where = f"this host's {format_bytes(memory)}"
    share = MEMORY_SHARE[launch.kind]
    if memory and zarr_run.nbytes > share * memory:
        raise ParamError(f"sizes: the {scale} store ({format_bytes(zarr_run.nbytes)}) is read whole into the workers' "
                         f"memory, more than {share:.0%} of {where}")
    return zarr_run
