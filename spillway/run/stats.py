"""Bytes moved between workers, bytes spilled and peak memory of a run, from the workers'
snapshots (:func:`spillway.launch.plugins.worker_snapshot`) before and after it."""

from __future__ import annotations

import statistics


def transfer_stats(before: dict, after: dict, *, start_wall: float) -> dict:
    """Bytes moved between workers, bytes spilled and peak memory, from two snapshots."""
    transferred = 0
    bandwidths = []
    for addr, snap in after.items():
        for t in snap["transfers"]:
            if t["start"] >= start_wall - 1e-3:
                transferred += t["bytes"]
                if t["bytes"] > 1_000_000:
                    bandwidths.append(t["bytes"] / max(1e-6, t["stop"] - t["start"]))
    spilled: dict[str, int] = {}
    spill_per_worker = {}
    rounds: dict[str, int] = {}
    for addr, snap in after.items():
        was = before.get(addr, {})
        old = was.get("spilled", {})
        for tier, nbytes in snap["spilled"].items():
            spilled[tier] = spilled.get(tier, 0) + nbytes - old.get(tier, 0)
        if snap.get("store"):
            spill_per_worker[addr] = _store_delta(was.get("store"), snap["store"])
        old_rounds = was.get("exchange_rounds", {})
        for kind, n in snap.get("exchange_rounds", {}).items():
            if delta := n - old_rounds.get(kind, 0):
                rounds[kind] = rounds.get(kind, 0) + delta
    out = {
        "bytes_transferred": transferred,
        # the rounds the exchanges' steps moved over each kind (ipc, ucxx, host), all workers
        "exchange_rounds": rounds,
        "transfer_gbps_median": statistics.median(bandwidths) / 1e9 if bandwidths else None,
        "bytes_spilled": sum(spilled.get(t, 0) for t in ("device_to_host", "host_to_disk")),
        "spilled_by_tier": spilled,
        "peak_bytes_per_worker": {addr: snap["peak_bytes"] for addr, snap in after.items()},
        "memory_measure": next(iter(after.values()))["memory_measure"] if after else None,
        # each worker process's resident host memory at its highest during the run
        "peak_host_bytes_per_worker": {addr: snap.get("host_peak_bytes") for addr, snap in after.items()},
        "spill": spill_per_worker or None,
    }
    return out


def _store_delta(before: dict | None, after: dict) -> dict:
    """Per-move bytes, seconds and GB/s of one worker's tiered store during the run."""
    old = (before or {}).get("stats") or {"bytes": {}, "seconds": {}, "wait_s": 0.0, "prefetched_bytes": 0,
                                          "ondemand_events": 0, "ondemand_bytes": 0}
    new = after["stats"]
    moves = {}
    for move, nbytes in new["bytes"].items():
        b = nbytes - old["bytes"].get(move, 0)
        sec = new["seconds"][move] - old["seconds"].get(move, 0.0)
        moves[move] = {"bytes": b, "seconds": sec, "gbps": b / sec / 1e9 if sec > 0 else None}
    return {
        "moves": moves,
        "wait_s": new["wait_s"] - old["wait_s"],
        "prefetched_bytes": new["prefetched_bytes"] - old["prefetched_bytes"],
        "ondemand_events": new["ondemand_events"] - old["ondemand_events"],
        "ondemand_bytes": new["ondemand_bytes"] - old["ondemand_bytes"],
        "resident": {k: after[k] for k in ("device_bytes", "host_bytes", "disk_bytes")},
        "host_memory": _host_memory(before, after),
    }


def _host_memory(before: dict | None, after: dict) -> dict | None:
    """What the machine said of the worker's host memory during the run (the lowest
    available its books saw, reset with the run's window), and the time it was paused
    for it; the process's peak is ``peak_host_bytes_per_worker``."""
    books = after.get("books")
    if not books:
        return None
    pause, old = after.get("host_pause") or {}, (before or {}).get("host_pause") or {}
    return {
        "lowest_available_bytes": books["lowest_available_bytes"],
        "other_bytes": books["other_bytes"],
        "headroom_bytes": books["headroom_bytes"],
        "short_events": books["short_events"] - ((before or {}).get("books") or {}).get("short_events", 0),
        "pauses": pause.get("pauses", 0) - old.get("pauses", 0),
        "paused_s": pause.get("paused_s", 0.0) - old.get("paused_s", 0.0),
    }
