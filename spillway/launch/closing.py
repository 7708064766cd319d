"""Closing a cluster spillway started: how long each worker gets to exit (from the pools it
holds) and the order of the close (workers, then the scheduler)."""

from __future__ import annotations

import contextlib
import logging

from .spec import WorkerSpec

logger = logging.getLogger("spillway")


#: seconds a worker process has to exit when spillway closes its cluster (distributed's
#: nanny gives it 5 s, the last second for the kill: "Worker process still alive after 4.0
#: seconds, killing" ended every close on the GPU host) ...
CLOSE_BASE_S = 15
#: ... and one more second for each of these many bytes the worker holds in its RMM pool
#: and pinned host memory: handing them back is most of a large worker's exit (48 GB
#: pinned beside a 126 GB pool took over 5 s on the GPU host)
CLOSE_BYTES_PER_S = 8 * 10**9


def close_timeout_s(spec: WorkerSpec | None, device_memory: int = 0) -> float:
    """Seconds a GPU worker of ``spec`` (None: a CPU worker) gets to exit on close, from
    what it may hold: its RMM pool (a fraction of ``device_memory``, the GPU's bytes, or
    bytes) and the pinned host memory it may take (its pinned bound, or the arena's size
    where that is larger)."""
    held = 0
    if spec is not None:
        pool = spec.pool_size
        if isinstance(pool, float):
            held += int(pool * device_memory)
        elif pool:
            held += int(pool)
        if spec.tiered:
            held += max(int(spec.pinned_limit or 0), int(spec.pinned_arena or 0))
    return CLOSE_BASE_S + held / CLOSE_BYTES_PER_S


def close_cluster(cluster, timeout: float | None = None) -> None:
    """Close a cluster spillway started: its workers first, each given ``timeout`` seconds
    to exit (:func:`close_timeout_s`; None keeps distributed's 5 s), then the scheduler.
    A worker process that outlives that after its work is done is killed, and the close
    goes on: waiting longer would not keep anything."""
    try:
        if timeout is not None:
            _close_workers(cluster, timeout)
        cluster.close()
    except TimeoutError:
        logger.warning("closing the cluster: a worker process did not exit within the close timeout "
                       "and was killed (workers with large pinned or RMM pools take longer to exit)")


#: seconds each worker gets to exit when the cluster closes because its user interrupted
#: (Ctrl-C, SIGTERM): nothing it holds is wanted any more, and the tasks it runs are not
#: waited for (a large chunk's task held a Ctrl-C 12 s before the nanny killed its worker)
INTERRUPTED_CLOSE_S = 1.0


def closer(cluster, timeout: float | None):
    """The exit callback of a context that holds ``cluster`` (for ``ExitStack.push``):
    :func:`close_cluster` within ``timeout``, or, where the context ends with an
    interrupt, within :data:`INTERRUPTED_CLOSE_S` and without a log line: what is said is
    the command's one line of what it stopped."""

    def close(exc_type, exc, tb) -> bool:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            with quiet_logs(), contextlib.suppress(TimeoutError, KeyboardInterrupt):
                _close_workers(cluster, INTERRUPTED_CLOSE_S)
                cluster.close()
        else:
            close_cluster(cluster, timeout)
        return False

    return close


@contextlib.contextmanager
def quiet_logs():
    """Nothing below CRITICAL reaches a stream from the root logger's handlers or
    distributed's meanwhile: a nanny killing its worker, or told by the scheduler that the
    worker is gone, says so (the stop is what was asked), and in the command line those
    lines reach the root logger's handler (spillway's death watch lets them through)."""
    handlers = [h for name in ("", "distributed") for h in logging.getLogger(name).handlers
                if isinstance(h, logging.StreamHandler)]
    levels = [h.level for h in handlers]
    for h in handlers:
        h.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for h, level in zip(handlers, levels):
            h.setLevel(level)


def _close_workers(cluster, timeout: float) -> None:
    workers = list(getattr(cluster, "workers", {}).values())
    if workers and hasattr(cluster, "sync"):
        cluster.sync(_close_all, workers, timeout)


async def _close_all(workers, timeout: float) -> None:
    import asyncio

    # nannies (and in-process workers) close their worker within ``timeout``; the cluster's
    # own close then finds them closed
    await asyncio.gather(*(w.close(timeout=timeout) for w in workers))
