"""The forced-bytes bound of one out-of-core run: the least bytes any placement of its
values must move between device, host and disk, and the time those take at the ceilings
measured in the same bench run.

The tiers' bound (:mod:`.tiersbound`) prices the bytes the run chose to move, so a store
that spills a value, reads it back and spills it again is 1.0x that bound while it moves
twice what it had to. This bound prices what the capacities force, per worker, from:

* ``peak``: the most bytes of values the worker's store held at once during the run,
  every tier together (:attr:`~spillway.memory.store.TieredStore.peak_bytes`, reset
  before the clock starts);
* ``device`` and ``host``: the device and host tiers' limits;
* what the store held below the device when the clock started (the persisted inputs past
  the device: ``start_host``, ``start_disk``).

Then, with ``below = max(0, peak - device)`` the bytes that must be below the device at
the peak:

    device_to_host >= below - start_host - start_disk   (what is below at the peak and was
                                                        not there at the start went down)
    host_to_disk   >= max(0, below - host) - start_disk
    host_to_device >= start_host + start_disk           (the run reads its inputs, and
    disk_to_host   >= start_disk                        a GPU reads them on the device)

The last two hold for the bench's timed runs, which read every input they persisted
(:func:`~.measure.split_inputs`), and for nothing in general. A placement may keep a
value's host copy when it reads it back (values do not change), so an input read up costs
no second spill; the bound allows it. Each worker's moves are summed, and priced with
:func:`.copybound.copy_bound` (a link to the host per GPU, the disk shared).
"""

from __future__ import annotations

from collections.abc import Mapping

from .copybound import MOVE_CEILINGS, copy_bound

#: each move's short name in the bench's log lines and tables
SHORT = {"device_to_host": "D->H", "host_to_device": "H->D", "host_to_disk": "H->disk", "disk_to_host": "disk->H"}


def worker_forced(start: Mapping | None, end: Mapping | None) -> dict | None:
    """Bytes each move must carry on one worker between two
    :func:`~spillway.launch.plugins.worker_snapshot` of it, the peak read at ``end``
    (reset at ``start``); None where the worker has no tiered store that keeps a peak."""
    first, last = (start or {}).get("store"), (end or {}).get("store")
    if not first or not last or last.get("peak_bytes") is None:
        return None
    tiers = last.get("tiers") or {}
    device = (tiers.get("device") or {}).get("limit")
    host = (tiers.get("host") or {}).get("limit")
    peak = int(last["peak_bytes"])
    start_host, start_disk = int(first.get("host_bytes") or 0), int(first.get("disk_raw_bytes") or 0)
    below = max(0, peak - device) if device is not None else 0
    on_disk = max(0, below - host) if host is not None else 0
    return {
        "peak_bytes": peak,
        "device_limit": device,
        "host_limit": host,
        "start_below_bytes": start_host + start_disk,
        "moves": {
            "device_to_host": max(0, below - start_host - start_disk),
            "host_to_device": start_host + start_disk,
            "host_to_disk": max(0, on_disk - start_disk),
            "disk_to_host": start_disk,
        },
    }


def forced_moves(start: Mapping[str, Mapping], end: Mapping[str, Mapping]) -> dict | None:
    """The forced bytes of every move summed over the workers (``moves``), the workers'
    peaks summed (``peak_bytes``) and each worker's figures (``workers``); None where no
    worker keeps a peak (plain dask-cuda)."""
    workers = {addr: worker_forced(start.get(addr), snap) for addr, snap in end.items()}
    workers = {addr: w for addr, w in workers.items() if w is not None}
    if not workers:
        return None
    moves = {m: sum(w["moves"][m] for w in workers.values()) for m in MOVE_CEILINGS}
    return {"moves": moves, "peak_bytes": sum(w["peak_bytes"] for w in workers.values()), "workers": workers}


def forced_bound(forced: Mapping | None, moved: Mapping[str, int] | None, gbps: Mapping[str, float] | None,
                 links: int, seconds: float | None) -> dict | None:
    """``forced_bound_s`` (None where a forced move has no measured ceiling) with its
    ``terms`` (bytes, ceiling, seconds of each forced move), ``moved_over_forced`` (bytes
    the run moved over the bytes forced, per move; None where nothing was forced) and
    ``time_over_forced``; None without ``forced``."""
    if not forced:
        return None
    bound = copy_bound(forced["moves"], gbps, links)
    moved = moved or {}
    ratios = {m: (int(moved.get(m) or 0) / f if f else None) for m, f in forced["moves"].items()}
    b = bound["bound_s"]
    return {
        "forced_bound_s": b,
        "terms": bound["moves"],
        "missing": bound["missing"],
        "forced_bytes": dict(forced["moves"]),
        "moved_bytes": {m: int(moved.get(m) or 0) for m in forced["moves"]},
        "moved_over_forced": ratios,
        "peak_bytes": forced.get("peak_bytes"),
        "time_over_forced": seconds / b if seconds is not None and b else None,
    }
