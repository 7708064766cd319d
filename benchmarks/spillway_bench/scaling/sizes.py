"""The study's workloads and their sizes at a worker count, weak or strong (pure
functions: no cluster, no GPU)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from spillway.options.errors import ParamError

from ..workloads import Workload, data_bytes

#: the worker count whose sizes the weak mode keeps per worker (the issue's 2 x H200 host)
BASE_WORKERS = 2

MODES = ("weak", "strong")

#: how each workload of the study grows in weak mode: "square" grows both axes alike
#: (x + x.T and x.dot(y) need square operands), a tuple the axes that grow
GROWTH: dict[str, str | tuple[int, ...]] = {
    "W1": "square",
    "W2": "square",
    # rows in, columns out: the leading axis grows in whole column chunks, so each output
    # chunk gathers from as many input chunks as on two workers
    "W3": (0,),
    # the transformed axis 0 must stay one chunk: the panels multiply along axis 1
    "W4": (1,),
    "W5": (0,),
    "B2": "square",
}

#: workloads of ``spillway bench`` the study leaves out, and why
LEFT_OUT = {
    "B1": ("sized to exceed the memory two H200s give a worker by default (204.8 GB): with strong "
           "scaling 4 or 8 GPUs hold it outright, so it stops measuring what it is for, and with weak "
           "scaling it is W1 at 102 GB per GPU, 819 GB of inputs to persist per run on 8 GPUs"),
    "B3": ("sized to 1.5 times two H200s, with tier limits per worker: with weak scaling 8 GPUs need "
           "1.7 TB over device, pinned host and disk, more disk than the 8-GPU host has; with strong "
           "scaling its 423 GB fit on 4 GPUs' devices and the tiers go unused"),
}

#: the workloads of one study run, in the order they run; each part is one cluster
#: (B2's device limit needs its own anyway) and is written before the next starts.
#: W3 goes last: its thousands of slicing tasks make it the hardest to predict.
PARTS = (("W1", "W2", "W4", "W5"), ("B2",), ("W3",))
STUDY = tuple(name for part in PARTS for name in part)

def _nearest_square(target: float) -> int:
    """The k >= 1 whose k^2 is nearest ``target``; ties go to the larger k."""
    low = max(1, math.isqrt(math.floor(target)))
    return min((low, low + 1), key=lambda k: (abs(k * k - target), -k))


def growth_step(params: Mapping[str, Any], axis: int) -> int:
    """The smallest length by which ``axis`` can grow keeping every chunk shape of the
    workload (input chunks, and the chunks it rechunks to or produces) whole."""
    step = 1
    for key in ("chunks", "to_chunks", "out_chunks"):
        chunks = params.get(key)
        if chunks:
            step = math.lcm(step, int(chunks[axis]))
    return step


def _check_divisible(name: str, params: Mapping[str, Any]) -> None:
    shape = params["shape"]
    for key in ("chunks", "to_chunks", "out_chunks"):
        chunks = params.get(key)
        if chunks and any(s % c for s, c in zip(shape, chunks)):
            raise ParamError(f"{name}: shape {tuple(shape)} is not a whole number of {key} {tuple(chunks)}")


def weak_params(workload: Workload, scale: str, n_workers: int) -> dict:
    """The workload's parameters at ``scale`` with the data per worker it has on
    :data:`BASE_WORKERS` workers, for ``n_workers`` workers."""
    if n_workers < 1:
        raise ParamError(f"n-workers: {n_workers} must be >= 1")
    base = dict(workload.params(scale))
    growth = GROWTH.get(workload.name)
    if growth is None:
        raise ParamError(f"only: {workload.name} is not part of the scaling study")
    _check_divisible(workload.name, base)
    shape = list(base["shape"])
    factor = n_workers / BASE_WORKERS
    if growth == "square":
        step = growth_step(base, 0)
        if shape[0] != shape[1] or growth_step(base, 1) != step:
            raise ParamError(f"{workload.name}: square growth needs a square shape and chunks, got {tuple(shape)}")
        k = _nearest_square((shape[0] // step) ** 2 * factor)
        shape[0] = shape[1] = k * step
    else:
        (axis,) = growth
        step = growth_step(base, axis)
        target = shape[axis] / step * factor
        units = max(1, min((math.floor(target), math.ceil(target)), key=lambda u: (abs(u - target), -u)))
        shape[axis] = units * step
    out = dict(base, shape=tuple(shape))
    if tuple(base.get("out_shape", ())) == tuple(base["shape"]):
        out["out_shape"] = tuple(shape)
    return out


def strong_params(workload: Workload, scale: str, n_workers: int) -> dict:
    """Strong scaling: the workload's size at ``scale``, whatever the worker count."""
    if n_workers < 1:
        raise ParamError(f"n-workers: {n_workers} must be >= 1")
    return dict(workload.params(scale))


def scaled_params(workload: Workload, scale: str, mode: str, n_workers: int) -> dict:
    if mode not in MODES:
        raise ParamError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    return (weak_params if mode == "weak" else strong_params)(workload, scale, n_workers)


def scaled(workload: Workload, scale: str, mode: str, n_workers: int) -> Workload:
    """A copy of ``workload`` whose size under ``scale`` is the scaled one (its other
    scales are dropped, so nothing can run it at a size the study did not choose)."""
    return dataclasses.replace(workload, sizes={scale: scaled_params(workload, scale, mode, n_workers)})


def row_bytes(workload: Workload, params: Mapping[str, Any]) -> int:
    """Bytes of one growth step of the inputs: one row of chunks (square growth) or one
    step of the growing axis across the rest of the array."""
    growth = GROWTH[workload.name]
    axis = 0 if growth == "square" else growth[0]
    shape = list(params["shape"])
    shape[axis] = growth_step(params, axis)
    return data_bytes(dict(params, shape=tuple(shape)))


def modes_at(n_workers: int, mode: str) -> list[str]:
    """The modes one run at ``n_workers`` serves: both at the base count (same sizes)."""
    return list(MODES) if n_workers == BASE_WORKERS else [mode]


def study(only: str | None) -> list[str]:
    """The study's workloads named in ``only`` ("W1,B2"), in run order; all by default."""
    if not only:
        return list(STUDY)
    names = [n.strip().upper() for n in only.split(",") if n.strip()]
    for n in names:
        if n in LEFT_OUT:
            raise ParamError(f"only: {n} is not part of the scaling study: {LEFT_OUT[n]}")
        if n not in STUDY:
            raise ParamError(f"only: {n!r} is not a workload of the scaling study (known: {', '.join(STUDY)})")
    return [n for n in STUDY if n in names]
