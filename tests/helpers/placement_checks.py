"""How evenly a persisted collection sits on the workers: what the placement tests check
(the scheduler's view of each worker's bytes)."""

from __future__ import annotations


def bytes_per_worker(client, collection) -> dict[str, int]:
    """Bytes of a persisted collection's chunks held by each worker (scheduler's view)."""
    from dask.core import flatten

    keys = list(flatten(collection.__dask_keys__()))
    return client.run_on_scheduler(_held_bytes, keys)


def _held_bytes(keys, dask_scheduler=None) -> dict[str, int]:
    out: dict[str, int] = {ws.address: 0 for ws in dask_scheduler.workers.values()}
    for key in keys:
        ts = dask_scheduler.tasks.get(key)
        if ts is None or ts.nbytes < 0:
            continue
        for ws in ts.who_has or ():
            out[ws.address] = out.get(ws.address, 0) + ts.nbytes
    return out


def imbalance(per_worker: dict[str, int]) -> float:
    """Largest relative distance of a worker's bytes from an even share (0.1 is 10%)."""
    if not per_worker:
        return 0.0
    share = sum(per_worker.values()) / len(per_worker)
    return max(abs(v - share) for v in per_worker.values()) / share if share else 0.0
