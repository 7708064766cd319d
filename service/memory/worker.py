"""The tiered store inside a GPU worker: built by the worker from ``(make_store, kwargs)``
and wired to the worker's task queue, RMM resource and event loop by the worker plugin."""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from .arena import Arena
from .codecs import CupyCodec
from .disk import DiskTier
from .host import HostBuffers
from .store import TieredStore

logger = logging.getLogger("spillway.memory")


def take_pinned(nbytes: int) -> np.ndarray:
    """Pinned host memory, touched once so its pages exist before the first spill."""
    import cupyx

    buf = cupyx.empty_pinned(nbytes, dtype=np.uint8)
    buf[:: 4096] = 0
    return buf


def make_store(
    *,
    worker_local_directory: str,
    device_memory_limit,
    host_limit: int | None,
    pinned_pool_size: int,
    pinned_limit: int | None = None,
) -> TieredStore:
    """Runs in the worker process (its CUDA_VISIBLE_DEVICES already set)."""
    from dask_cuda.utils import parse_device_memory_limit

    device_limit = parse_device_memory_limit(device_memory_limit, device_index=0) or math.inf
    # past the arena, pinned buffers from CuPy's pool (freed ones are reused) up to the
    # worker's share of what the host may pin, then pageable ones
    host = HostBuffers(None, _pinned_fallback,
                       pinned_limit=math.inf if pinned_limit is None else pinned_limit)
    if pinned_pool_size:
        # Taken here, while the worker process is built and before it opens its comms, so
        # a worker is up only once its pool is (80 GB took about 35 s on the GPU host).
        _take_arena(host, pinned_pool_size)
    return TieredStore(
        device_limit=device_limit,
        host_limit=host_limit or math.inf,
        codec=CupyCodec(),
        disk=DiskTier(worker_local_directory),
        host=host,
    )


def _take_arena(host: HostBuffers, nbytes: int) -> None:
    start = time.perf_counter()
    try:
        host.arena = Arena(take_pinned(nbytes))
        logger.info("took %d bytes of pinned host memory in %.1f s", nbytes, time.perf_counter() - start)
    except Exception:
        logger.exception("could not take %d bytes of pinned host memory; using pinned buffers on demand", nbytes)


def _pinned_fallback(nbytes: int) -> np.ndarray:
    import cupyx

    return cupyx.empty_pinned(nbytes, dtype=np.uint8)
