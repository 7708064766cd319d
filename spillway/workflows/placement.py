"""Spreading an input evenly over the GPU workers.

Left to itself the scheduler puts a generated input wherever a worker is free, and one
GPU can fill up and spill while another sits half empty. An input larger than half a
worker's memory is therefore assigned chunk by chunk: contiguous runs of chunks (so
neighbours, halos and panels mostly stay on one worker) whose bytes are as close to an
even share as the chunk sizes allow. The assignment travels as dask ``workers``
annotations with ``allow_other_workers`` so a lost worker does not stall the run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from .params import Target

#: spread an input once it needs more than this share of one worker's memory
SPREAD_FRACTION = 0.5


def spread_workers(target: Target, nbytes: int) -> tuple[str, ...]:
    """The workers to spread an input of ``nbytes`` over, or () to leave it to the scheduler."""
    if target.kind != "gpu" or len(target.workers) < 2:
        return ()
    if nbytes <= SPREAD_FRACTION * target.worker_bytes:
        return ()
    return tuple(target.workers)


def assign(chunks: Sequence[Sequence[int]], itemsize: int, workers: Sequence[str]) -> dict[tuple[int, ...], str]:
    """Block index -> worker: contiguous runs in C order, each close to an even share of bytes.

    A block goes to the worker whose share its midpoint (in cumulative bytes) falls in, so
    no worker is more than half a block away from an even share.
    """
    if not workers:
        raise ValueError("assign needs at least one worker")
    sizes = {}
    for index in itertools.product(*(range(len(c)) for c in chunks)):
        sizes[index] = math.prod(c[i] for c, i in zip(chunks, index)) * itemsize
    total = sum(sizes.values())
    share = total / len(workers)
    out = {}
    done = 0
    for index, nbytes in sizes.items():
        middle = done + nbytes / 2
        out[index] = workers[min(len(workers) - 1, int(middle // share))]
        done += nbytes
    return out


def planned_bytes(assignment: dict[tuple[int, ...], str], chunks, itemsize: int) -> dict[str, int]:
    """Bytes each worker is assigned."""
    out: dict[str, int] = {}
    for index, worker in assignment.items():
        nbytes = math.prod(c[i] for c, i in zip(chunks, index)) * itemsize
        out[worker] = out.get(worker, 0) + nbytes
    return out
