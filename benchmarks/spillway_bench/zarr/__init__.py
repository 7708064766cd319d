"""``spillway bench --zarr``: writing and reading Zarr v3 stores from the cluster's
workers, against the disk and host-copy ceilings of the same run.

The store is shaped like a daily climate record: float32 days x 721 x 1440 (a 0.25
degree grid), one chunk per 365 days (1.5 GB), 100 GB at ``--sizes full`` and 12 GB at
``small``; ``tiny`` (the CPU default) is a 2.5 degree grid of 61 MB. Values are seeded
uniform numbers kept to 0.001, as stored records keep a fixed precision (so that zstd has
something to compress, as it has in real data). Two stores are written from the same
chunks and read back, each in turn (so the disk holds one at a time):

* ``uncompressed``: spillway's own output path (:mod:`spillway.workflows.zarr`: uncompressed
  chunks, written from device memory with KvikIO on GPU workers);
* ``zstd``: what GPU reads of compressed data want, through the user's path (dask's
  ``store`` into a zarr array, zarr's CPU zstd encoder; CuPy chunks reach zarr through
  :mod:`spillway.memory.zarr_buffer`): shards of 365 days, each day cut into bands of rows of
  at most 1 MiB, each band an inner chunk of its own zstd frame, so a shard is thousands
  of frames that nvCOMP decodes in one batch.

Each store is measured three ways, each read checked bit for bit against what was
written:

* ``write``: from persisted chunks to files, until the files are on disk (``fsync``),
  against the ``disk_write`` ceiling;
* ``cold read``: with the store's pages dropped from the page cache first (as the
  ``disk_read`` ceiling drops its own), against ``disk_read``; target 70% of it. For the
  zstd store the ratio is of the bytes that crossed the disk (stored bytes);
* ``cached read``: with the store in the page cache, against the pinned host -> GPU copy
  of every GPU of the run (``host_copy`` on CPU workers); target 10 GB/s per host of
  array (decoded) bytes.

GB/s are of array bytes (decoded) unless said. The zstd reads also give the **GPU decode
rate**: bytes nvCOMP decoded per second spent decoding (until its stream finished), per
GPU, from the workers' counters; target 5 GB/s.

The store lies in ``--local-directory`` (the system's temporary directory without it),
where the disk ceilings are measured too, and is removed afterwards. Files go to
``<out>/<machine>-<date>-zarr[-<label>].{json,md,png}``.
"""

from __future__ import annotations

from .prepare import SCALES, ZarrRun, prepare_zarr
from .render import short_table
from .run import run_zarr_bench

__all__ = ["SCALES", "ZarrRun", "prepare_zarr", "run_zarr_bench", "short_table"]
