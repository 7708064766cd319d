"""The bounds a run is read against: the least time the ceilings measured in the same run
(:mod:`.ceilings`) allow, so ``time / bound`` says how far a run is from the hardware,
independently of any baseline. How each is computed: ``benchmarks/README.md``, "Bounds".

- :func:`copy_bound`: the bytes a run moved between device, host and disk, each move over
  its ceiling (``d2h_pinned``, ``h2d_pinned``, ``disk_write``, ``disk_read``), a host link
  per GPU, the disk shared, the moves added (not overlapped);
- :func:`tiers_bound` (O3-O5, per side): the copy bound plus the bytes between workers over
  ``peer_copy`` (``same_gpu_copy`` where workers share a GPU), divided over the GPUs;
- :func:`forced_bound`: the same pricing of the least bytes any placement must move, from
  each worker's peak held bytes and its tiers' limits (:func:`worker_forced`);
- :func:`bound` (the W rows): the larger of the compute bound (FP64 GEMM rate or least HBM
  traffic, spread over the GPUs) and the copy bound plus the bytes between workers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

#: each move and the ceiling (a :mod:`.ceilings` name) it is read against
MOVE_CEILINGS = {"device_to_host": "d2h_pinned", "host_to_device": "h2d_pinned",
                 "host_to_disk": "disk_write", "disk_to_host": "disk_read"}
#: the moves that have a link per GPU (the others share the host's disk)
PER_GPU = ("device_to_host", "host_to_device")
#: the chunk-sized buffers the copy ceilings are measured with
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


def copy_ceilings(kind: str, devices: tuple, *, nbytes: int = CEILING_BYTES, directory: str | None = None,
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


# --- the forced bytes


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


# --- the tiers' bound of an out-of-core side


#: the bytes between workers and the ceiling they are read against
BETWEEN = "between_workers"
PEER_CEILINGS = ("peer_copy", "same_gpu_copy")


def tiers_bound(moves: Mapping[str, int] | None, bytes_moved: int | None, gbps: Mapping[str, float] | None,
                links: int = 1) -> dict:
    """``{"bound_s", "terms": {move: {bytes, ceiling, ceiling_gbps, divided_by, seconds}},
    "missing", "links"}`` for ``moves`` (bytes by move between tiers, summed over the
    workers) and ``bytes_moved`` between workers, at the rates ``gbps`` over ``links``
    GPUs. ``bound_s`` is None where a move that happened has no measured rate (``missing``
    names it), 0 where nothing moved."""
    gbps = gbps or {}
    links = max(1, int(links))
    # the moves between tiers are the copy bound's; the moves between workers are added
    # here, over the link each GPU has in from the others
    tiers = copy_bound(moves, gbps, links)
    terms = {move: {**t, "divided_by": links if move in PER_GPU else 1} for move, t in tiers["moves"].items()}
    missing = list(tiers["missing"])
    nbytes = int(bytes_moved or 0)
    if nbytes > 0:
        name = next((n for n in PEER_CEILINGS if gbps.get(n)), PEER_CEILINGS[0])
        rate = gbps.get(name)
        if not rate:
            missing.append(name)
        terms[BETWEEN] = {"bytes": nbytes, "ceiling": name, "ceiling_gbps": rate, "divided_by": links,
                          "seconds": nbytes / (rate * 1e9 * links) if rate else None}
    bound = None if missing else sum(t["seconds"] for t in terms.values())
    return {"bound_s": bound, "terms": terms, "missing": missing, "links": links}


def side_bounds(side: Mapping, gbps: Mapping[str, float] | None, links: int) -> dict:
    """A side's bounds from its JSON (:meth:`~.measure.SideResult.to_json`): the median
    timed run's (median bytes of each move) and the first run's, each with its time and
    their ratio. Fields: ``bound_s``, ``time_over_bound``, ``tiers_bound``, and the
    same with ``first_``; beside them the forced-bytes bound (:func:`forced_bound`):
    ``forced_bound_s``, ``time_over_forced`` and ``forced_bound`` (its terms and each
    move's ``moved_over_forced``), and the first run's."""
    # a side that failed or did not run has no bound: its bytes are a part of a run
    ran = side.get("median_s") is not None
    median = tiers_bound(move_bytes(side.get("spill_moves")), side.get("bytes_moved"), gbps, links)
    first = None
    if side.get("first_s") is not None:
        first = tiers_bound(move_bytes(side.get("first_spill_moves")), side.get("first_bytes_moved"), gbps, links)
    forced = forced_bound(side.get("forced_moves"), move_bytes(side.get("spill_moves")), gbps, links,
                          side.get("median_s")) if ran else None
    first_forced = forced_bound(side.get("first_forced_moves"), move_bytes(side.get("first_spill_moves")), gbps,
                                links, side.get("first_s"))
    return {
        "forced_bound_s": (forced or {}).get("forced_bound_s"),
        "time_over_forced": (forced or {}).get("time_over_forced"),
        "forced_bound": forced,
        "first_forced_bound_s": (first_forced or {}).get("forced_bound_s"),
        "first_over_forced": (first_forced or {}).get("time_over_forced"),
        "first_forced_bound": first_forced,
        "bound_s": median["bound_s"] if ran else None,
        "time_over_bound": _ratio(side.get("median_s"), median["bound_s"]),
        "tiers_bound": median if ran else None,
        "first_bound_s": (first or {}).get("bound_s"),
        "first_over_bound": _ratio(side.get("first_s"), (first or {}).get("bound_s")),
        "first_tiers_bound": first,
    }


def _ratio(a, b):
    return a / b if a is not None and b else None


# --- compute and copy bound of a workload


#: the ceilings the compute bound reads (TFLOP/s for the GEMM, GB/s)
GEMM = "fp64_gemm_tflops"
HBM = "hbm_copy"


def elements(params: Mapping[str, Any]) -> int:
    return math.prod(params["shape"])


def array_bytes(params: Mapping[str, Any]) -> int:
    return elements(params) * np.dtype(params["dtype"]).itemsize


def streamed(passes: float):
    """Work of an expression that reads and writes its input ``passes`` times in all (a
    pass is the input's bytes once, read or written)."""
    return lambda p: {"flops": 0, "hbm_bytes": int(passes * array_bytes(p))}


def matmul(p: Mapping[str, Any]) -> dict:
    n = p["shape"][0]
    return {"flops": 2 * n ** 3, "hbm_bytes": 3 * array_bytes(p)}


def compute_bound(work: Mapping[str, int] | None, gbps: Mapping[str, float], n_gpus: int) -> dict | None:
    """``{"flops_s", "hbm_s", "bound_s", "missing"}`` for ``work`` over ``n_gpus`` GPUs."""
    if not work:
        return None
    n = max(1, n_gpus)
    out: dict[str, Any] = {"flops": work.get("flops", 0), "hbm_bytes": work.get("hbm_bytes", 0), "missing": []}
    terms = []
    for key, label, name, scale in (("flops", "flops_s", GEMM, 1e12), ("hbm_bytes", "hbm_s", HBM, 1e9)):
        amount = work.get(key) or 0
        if not amount:
            continue
        rate = gbps.get(name)
        if not rate:
            out["missing"].append(name)
            continue
        seconds = amount / (rate * scale * n)
        out[label] = seconds
        terms.append(seconds)
    out["bound_s"] = max(terms) if terms and not out["missing"] else None
    return out


def transfer_bound(bytes_moved: int | None, gbps: Mapping[str, float], n_gpus: int) -> float | None:
    """Seconds to move ``bytes_moved`` between workers, each GPU's link in taking its share."""
    if not bytes_moved:
        return 0.0
    rate = next((gbps[n] for n in PEER_CEILINGS if gbps.get(n)), None)
    return bytes_moved / (rate * 1e9 * max(1, n_gpus)) if rate else None


def bound(work, bytes_moved, spill_bound_s, gbps: Mapping[str, float], n_gpus: int, seconds: float | None) -> dict:
    """A workload's bounds next to its time: ``compute`` (:func:`compute_bound`), ``copy_s``
    (between workers, plus device/host/disk), ``bound_s`` the larger, and ``ratio``."""
    compute = compute_bound(work, gbps, n_gpus)
    transfer = transfer_bound(bytes_moved, gbps, n_gpus)
    copy_s = None if transfer is None else transfer + (spill_bound_s or 0.0)
    # an unknown part (a ceiling not measured) leaves the bound unknown, not the other part
    unknown = copy_s is None or (compute is not None and compute.get("bound_s") is None)
    parts = [b for b in ((compute or {}).get("bound_s"), copy_s) if b is not None]
    total = None if unknown or not parts else max(parts)
    return {"compute": compute, "transfer_s": transfer, "copy_s": copy_s, "bound_s": total,
            "time_s": seconds, "ratio": seconds / total if seconds is not None and total else None}
