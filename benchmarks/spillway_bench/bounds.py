"""Each workload's bound: the least time the hardware measured in the same run allows.

- **compute bound**: the workload's arithmetic at the FP64 GEMM rate (``fp64_gemm_tflops``,
  for the matrix products) or its least device-memory traffic at the HBM copy rate
  (``hbm_copy``, bytes read plus written), whichever is longer, spread evenly over the
  GPUs;
- **copy bound**: the bytes the run moved between workers over each GPU's link in
  (``peer_copy``; a worker's link takes its share) plus its moves between device, host
  and disk (:mod:`.copybound`).

The bound is the larger of the two; ``time / bound`` says how far a run is from what the
GPUs could do, independently of any baseline. A workload declares its work
(:attr:`~.workloads.workload.Workload.work`) from its parameters alone: the traffic is the
expression's as written (``x + x.T`` reads x twice), not a cleverer algorithm's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

#: the ceilings the bounds read (GB/s, and TFLOP/s for the GEMM)
GEMM = "fp64_gemm_tflops"
HBM = "hbm_copy"
PEER = "peer_copy"


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
    rate = gbps.get(PEER) or gbps.get("same_gpu_copy")
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
