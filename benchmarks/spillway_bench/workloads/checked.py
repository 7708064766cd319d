"""B3, B4 and B5: beyond the GPUs' memory, run only when named, each checked against NumPy
float64 from the seeds (:mod:`..reference`). B3 persists its inputs over device, pinned
host and disk, on spillway's side only; B4 and B5 are sized at ``full`` from the machine's
GPUs (:meth:`Workload.for_machine`) and run against the baseline.
"""

from __future__ import annotations

import math

from . import expressions as ex
from .workload import Workload, square, workflow_size


def _b3_reference(p, seed):
    from ..reference import transpose_sum

    return transpose_sum(p["shape"], seed, p["dtype"])


#: B4's operands together and B5's array at this times the GPUs' memory at full size
OUT_OF_CORE_FACTOR = 1.3
#: full-size sides are rounded up to a multiple of this
SIDE_STEP = 1000


def side_for(nbytes: float, arrays: int = 1, itemsize: int = 8, step: int = SIDE_STEP) -> int:
    """The side of ``arrays`` square arrays holding at least ``nbytes`` together, rounded
    up to a multiple of ``step``."""
    side = math.sqrt(nbytes / (arrays * itemsize))
    return max(step, math.ceil(side / step) * step)


#: B3 small's input per GPU worker: past the worker's 30 GB device limit and 20 GB host
#: tier by a few GB of disk (120000^2 on 2 GPUs; 85000^2 on one, where 120000^2 would put
#: 65 GB on the one worker's disk, more than the 64 GB one-GPU host has)
B3_SMALL_PER_WORKER = 57.6e9


def b3_small(workers: int) -> dict:
    n = side_for(B3_SMALL_PER_WORKER * workers)
    return square((n, n), (10000, 10000))


B3 = Workload(
    name="B3", title="transpose-sum out of core (inputs over device, host and disk)",
    workflow="transpose-sum",
    # 1.5x the GPUs' memory at full size (423.2 GB on 2 x H200): per worker the device
    # holds up to its limit, the pinned host pool the next part, disk the rest
    sizes={"full": square((230000, 230000), (10000, 10000)),
           # where no GPU workers size it: two workers' worth, as on the 2 x H200 host
           "small": b3_small(2),
           "tiny": square((2400, 2400), (400, 400))},
    direct=ex.transpose_sum, workflow_params=workflow_size,
    spillway_cluster={
        # the RMM pool (90%, spillway's default) must hold the 125 GB the device tier may fill;
        # 48 GB pinned per worker keeps both workers' pools under half the 270 GB host
        # (at 80 GB each the kernel's OOM killer ended the workers as they started)
        # the pinned pool counts toward the memory limit: each limit leaves the worker process
        # room beside it (a 20 GB pool under a 20 GB limit paused the worker for good)
        "full": {"device_memory_limit": "125GB", "memory_limit": "52GB", "pinned_pool_size": "48GB",
                 "rmm_pool_size": 0.9},
        "small": {"device_memory_limit": "30GB", "memory_limit": "24GB", "pinned_pool_size": "20GB"},
    },
    baseline_skip=("not run: plain LocalCUDACluster fails at this size (at B1's 204.8 GB its workers "
                   "already died of CUDA out of memory on the 2 x H200 host)"),
    default=False, warmup=False, reference=_b3_reference,
    # one run at full size persists 423 GB and moves ~320 GB through the tiers, over 2
    # minutes on the 2 x H200 host: one checked run is what a 10-minute device call holds
    max_runs={"full": 1},
    worker_sized={"small": b3_small},
)


def _b4_reference(p, seed):
    from ..reference import matmul_sum

    return matmul_sum(p["shape"], seed, p["dtype"])


def _matmul_square(shape, chunks):
    return square(shape, chunks, inputs=2, array_shape=shape)


def b4_full(device_bytes: int, gpus: int = 1, host_bytes: int | None = None) -> dict:
    """x and y square float64 holding 1.3x the GPUs' memory together, chunks 10000^2
    (however many GPUs hold it)."""
    n = side_for(OUT_OF_CORE_FACTOR * device_bytes, arrays=2)
    return _matmul_square((n, n), (min(n, 10000),) * 2)


B4 = Workload(
    name="B4", title="(x @ y).sum() beyond the GPUs' memory", workflow="matmul",
    # full: x and y together 1.3x the GPUs' memory (84000^2 each, 112.9 GB, on one H100 80 GB;
    # 157000^2 on 2 x H200), chunks 10000^2; the nominal 100000^2 is what runs without GPUs
    sizes={"full": _matmul_square((100000, 100000), (10000, 10000)),
           "small": _matmul_square((40000, 40000), (10000, 10000)),
           "tiny": _matmul_square((1200, 1200), (300, 300))},
    machine_sized=b4_full,
    direct=ex.matmul, then=ex.total,
    workflow_params=workflow_size,
    default=False, reference=_b4_reference, speedup_target=1.5,
    # plain dask-cuda ran out of device memory on (x @ y).sum() of 70000^2 operands on one
    # H100 (the matrix's user-code matmul): recorded as its result, the target then being
    # that spillway completes with NumPy's answer
    baseline_expected_failure="plain dask-cuda ran out of device memory on (x @ y).sum() past the GPU "
                              "(70000^2 operands on one H100 80 GB)",
    # at full size one run takes about a minute on each side, the reference another: a
    # warm-up and one checked run per side is what a 10-minute device call holds
    max_runs={"full": 1},
)


def _b5_reference(p, seed):
    from ..reference import array_sum

    # a rechunk moves values, it changes none: the sum is the input's, whatever the chunks
    return array_sum(p["shape"], seed, p["dtype"])


def _panels_square(n, rows):
    return square((n, n), (rows, n), array_shape=(n, n), to_chunks=(n, rows), out_chunks=(n, rows))


def b5_full(device_bytes: int, gpus: int = 1, host_bytes: int | None = None) -> dict:
    """A square float64 array of 1.3x the GPUs' memory, 1000-row panels to 1000-column panels
    (however many GPUs hold it; the host's memory does not size it)."""
    return _panels_square(side_for(OUT_OF_CORE_FACTOR * device_bytes), 1000)


B5 = Workload(
    name="B5", title="rechunk row panels to column panels, then .sum()", workflow="rechunk",
    # full: 1.3x the GPUs' memory (118000^2 float64, 111.4 GB, on one H100 80 GB; 222000^2 on
    # 2 x H200) in 1000-row panels to 1000-column panels; the nominal 158113^2 (200 GB) is
    # what runs without GPUs
    sizes={"full": _panels_square(158113, 1000),
           "small": _panels_square(60000, 1000),
           "tiny": _panels_square(2000, 50)},
    machine_sized=b5_full,
    direct=ex.rechunk, then=ex.total, baseline_direct=ex.rechunk_sum_user,
    workflow_params=workflow_size,
    baseline_expected_failure=("plain dask-cuda with dask's default (P2P) rechunk failed on the GPU host: "
                               "\"P2P ... failed during transfer phase\""),
    default=False, reference=_b5_reference, max_runs={"full": 1},
)

CHECKED = (B3, B4, B5)
