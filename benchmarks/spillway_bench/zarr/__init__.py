"""``spillway bench --zarr``: Zarr v3 stores (``uncompressed``, spillway's output path, and
sharded ``zstd``) written and read back by the workers, cold and page-cached, checked bit
for bit, against the disk and copy ceilings of the same run, with the GPU decode rate
(``benchmarks/README.md``). Files: ``<out>/<machine>-<date>-zarr[-<label>].{json,md,png}``.
"""

from __future__ import annotations

from .prepare import SCALES, ZarrRun, prepare_zarr
from .render import short_table
from .run import run_zarr_bench

__all__ = ["SCALES", "ZarrRun", "prepare_zarr", "run_zarr_bench", "short_table"]
