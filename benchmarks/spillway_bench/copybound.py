"""How far an out-of-core run is from its copy bound.

A run whose data does not fit on the GPUs must move bytes between device, host and disk;
copying them at the rates measured in the same run takes at least

    bound_s = sum over moves of bytes_moved / rate_of_that_move

with the moves and their ceilings (:mod:`.ceilings`): device -> host over ``d2h_pinned``,
host -> device over ``h2d_pinned``, host -> disk over ``disk_write``, disk -> host over
``disk_read``. Bytes are summed over the workers; each GPU has its own host link, so the
device <-> host bytes are divided by ``n_workers`` links (one on a one-GPU host), while
the disk is the host's one. The moves are added, not overlapped (a copy engine each way
could overlap device -> host with host -> device): the bound is what serial copies would
take, and ``time / bound`` is how many times that the run took. The store writes to disk
through the page cache, so a run may beat the fsync'd ``disk_write`` rate while the cache
has room; with copies both ways overlapping, or the page cache, a ratio below 1 is possible.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

#: each move and the ceiling (a :mod:`.ceilings` name) it is read against
MOVE_CEILINGS = {"device_to_host": "d2h_pinned", "host_to_device": "h2d_pinned",
                 "host_to_disk": "disk_write", "disk_to_host": "disk_read"}
#: the moves that have a link per GPU (the others share the host's disk)
PER_GPU = ("device_to_host", "host_to_device")
#: the ceilings the bound needs, and the chunk-sized buffers they are measured with
NAMES = tuple(MOVE_CEILINGS.values())
CEILING_BYTES = 512 * 2**20


def copy_bound(moves: Mapping[str, int] | None, gbps: Mapping[str, float] | None, n_workers: int = 1) -> dict:
    """``{"bound_s", "moves": {move: {bytes, ceiling, ceiling_gbps, seconds}}, "missing"}``
    for ``moves`` (bytes by move, summed over workers) at the rates ``gbps`` (GB/s by
    ceiling name). ``bound_s`` is None where a move that happened has no measured rate
    (``missing`` names it), 0 where nothing moved."""
    terms, missing = {}, []
    for move, name in MOVE_CEILINGS.items():
        nbytes = int((moves or {}).get(move) or 0)
        if nbytes <= 0:
            continue
        rate = (gbps or {}).get(name)
        if not rate:
            missing.append(name)
            terms[move] = {"bytes": nbytes, "ceiling": name, "ceiling_gbps": None, "seconds": None}
            continue
        links = max(1, n_workers) if move in PER_GPU else 1
        terms[move] = {"bytes": nbytes, "ceiling": name, "ceiling_gbps": rate,
                       "seconds": nbytes / (rate * 1e9 * links)}
    bound = None if missing else sum(t["seconds"] for t in terms.values())
    return {"bound_s": bound, "moves": terms, "missing": missing, "n_workers": max(1, n_workers)}


def with_time(bound: dict, seconds: float | None) -> dict:
    """``bound`` with the run's ``time_s`` and ``ratio`` (time over bound; None where
    either is missing or nothing moved)."""
    b = bound.get("bound_s")
    return {**bound, "time_s": seconds, "ratio": seconds / b if seconds is not None and b else None}


def move_bytes(moves: Mapping[str, Mapping] | None) -> dict[str, int]:
    """``{move: bytes}`` from ``{move: {"bytes": ...}}`` (the harness's and the run
    report's shape)."""
    return {m: int((v or {}).get("bytes") or 0) for m, v in (moves or {}).items()}


def summed_moves(per_worker: Mapping[str, Mapping] | None) -> dict[str, int]:
    """Bytes per move summed over workers from a run report's ``spill`` (per worker
    ``{"moves": {move: {"bytes": ...}}}``)."""
    out: dict[str, int] = {}
    for worker in (per_worker or {}).values():
        for move, nbytes in move_bytes(worker.get("moves")).items():
            out[move] = out.get(move, 0) + nbytes
    return out


def measure(kind: str, devices: tuple, *, nbytes: int = CEILING_BYTES, directory: str | None = None,
            log: Callable[[str], None] | None = None, timeout: float = 300) -> dict:
    """The ceilings the bound needs, measured now (before any cluster starts): the disk
    tier's write and read in ``directory``, and on GPUs the pinned copies of GPU 0 (in a
    child process, as the bench's). ``{"gbps": ..., "skipped": ...}``."""
    from . import ceilings

    gbps, skipped = {}, {}
    try:
        gbps.update(ceilings.disk_gbps(nbytes, directory))
    except OSError as e:
        skipped["disk_write"] = skipped["disk_read"] = f"{type(e).__name__}: {e}"
    if kind == "gpu":
        env = {"CUDA_VISIBLE_DEVICES": ",".join(ceilings.physical(tuple(devices)[:1]))}
        try:
            device = ceilings._child(["device", str(nbytes)], env, timeout)
        except RuntimeError as e:
            device = {"skipped": {"h2d_pinned": str(e), "d2h_pinned": str(e)}}
        for name in ("h2d_pinned", "d2h_pinned"):
            if name in device.get("gbps", {}):
                gbps[name] = device["gbps"][name]
            else:
                skipped[name] = device.get("skipped", {}).get(name, "not measured")
    else:
        skipped["h2d_pinned"] = skipped["d2h_pinned"] = "CPU workers: no GPU in this run"
    if log is not None:
        for name, value in gbps.items():
            log(f"ceiling {name:<12} {value:8.1f} GB/s")
        for name, why in skipped.items():
            log(f"ceiling {name:<12} skipped: {why}")
    return {"gbps": gbps, "skipped": skipped, "bytes": nbytes}
