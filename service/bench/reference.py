"""NumPy float64 references for the bench's checked workloads, computed on the host CPUs
from the seeds alone, independently of the cluster and its store.

The seeded generator is chunk-invariant (:mod:`workflows.random`), so the reference
regenerates the array in row panels of about :data:`PANEL_BYTES`, whatever the chunks
were, in parallel processes: memory stays bounded at any size.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os

import numpy as np

#: bytes of one panel a reference process generates at a time (the generator's
#: temporaries take a few times this; small, since the cluster's pinned pools stay up)
PANEL_BYTES = 256 * 2**20


def default_processes() -> int:
    """Host cores for the reference, leaving two for the cluster's processes."""
    return max(1, (os.cpu_count() or 2) - 2)


def _panel_sum(args) -> float:
    from workflows import random

    seed, shape, start, stop, dtype = args
    block = random.uniform_block(seed, 0, shape, ((start, stop), (0, shape[1])), dtype, "numpy")
    return float(block.astype(np.float64).sum())


def transpose_sum(shape: tuple[int, int], seed: int, dtype: str = "float64", *,
                  processes: int | None = None) -> float:
    """``(x + x.T).sum()`` in float64 for the seeded uniform ``x`` (stream 0): twice the
    sum of x, summed panel by panel."""
    rows = max(1, min(shape[0], PANEL_BYTES // (shape[1] * np.dtype(dtype).itemsize)))
    tasks = [(seed, tuple(shape), s, min(shape[0], s + rows), dtype) for s in range(0, shape[0], rows)]
    processes = min(processes or default_processes(), len(tasks))
    if processes == 1:
        return 2 * math.fsum(map(_panel_sum, tasks))
    with mp.get_context("spawn").Pool(processes) as pool:
        return 2 * math.fsum(pool.imap_unordered(_panel_sum, tasks, chunksize=1))
