"""One benchmark workload: its sizes by scale, how it is built (its registered workflow,
or the same expression directly), and the cluster settings it imposes."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from spillway import workflows
from spillway.options.errors import ParamError
from spillway.workflows.backend import chunk_backend_for
from spillway.workflows.params import Target

SCALES = ("tiny", "small", "full")


@dataclass(frozen=True)
class Built:
    """One workload instance: the lazy result and where it came from."""

    result: Any
    #: "workflow <name>" or "direct"
    source: str
    note: str | None = None


def data_bytes(params: Mapping[str, Any]) -> int:
    """Bytes of a workload's inputs at these parameters."""
    return params.get("inputs", 1) * math.prod(params["shape"]) * np.dtype(params["dtype"]).itemsize


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    #: the registered workflow this workload is, where it exists
    workflow: str | None
    #: scale -> parameters (shape, chunks, dtype and the workload's own)
    sizes: Mapping[str, Mapping[str, Any]]
    #: builds the expression directly: (params, backend, seed) -> lazy collection
    direct: Callable[[Mapping[str, Any], str, int], Any]
    #: parameters handed to the registered workflow, from the scale's parameters
    workflow_params: Callable[[Mapping[str, Any]], dict] | None = None
    #: Options changes the workload's definition imposes on both clusters, on GPUs
    gpu_cluster: Mapping[str, Any] = field(default_factory=dict)
    #: scale -> Options changes for spillway's side only, on GPUs (B3's tiers)
    spillway_cluster: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: why the baseline is not run, where it is not
    baseline_skip: str | None = None
    #: part of a plain ``spillway bench``, or only when named in ``--only``
    default: bool = True
    #: whether a warm-up run precedes the timed ones
    warmup: bool = True
    #: NumPy float64 reference of the result, (params, seed) -> value; the last timed
    #: run is checked against it
    reference: Callable[[Mapping[str, Any], int], Any] | None = None
    #: relative error the checked result may have
    tolerance: float = 1e-10
    #: scale -> most timed runs at that scale, where one run takes minutes (B3 full)
    max_runs: Mapping[str, int] = field(default_factory=dict)
    #: applied to the built array (workflow or direct): B4 and B5 end in ``.sum()``
    then: Callable[[Any], Any] | None = None
    #: the expression on the baseline's side where it differs from spillway's: what a
    #: user writes for plain dask-cuda, (params, backend, seed) -> lazy collection
    baseline_direct: Callable[[Mapping[str, Any], str, int], Any] | None = None
    #: side -> its own expression, where a side other than the baseline builds another
    #: graph from the same user code (O5's ``tasks_method``: dask's own halo tasks)
    side_direct: Mapping[str, Callable[[Mapping[str, Any], str, int], Any]] = field(default_factory=dict)
    #: why the baseline is expected to fail: its failure is then recorded as its result
    #: (with the error) and does not fail the bench
    baseline_expected_failure: str | None = None
    #: the issue's speedup target over the baseline, where the workload has one
    speedup_target: float | None = None
    #: ``full`` sized from the machine: (total bytes of the GPUs, number of GPUs) -> the
    #: scale's parameters (B4, B5: 1.3x the GPUs' memory whatever the host; O3, O4: a
    #: footprint past the GPUs' memory by a factor that depends on how many there are)
    machine_sized: Callable[[int, int, int | None], Mapping[str, Any]] | None = None
    #: the GPUs' total bytes ``full`` was sized from (:meth:`for_machine`), else None
    sized_from: int | None = None
    #: how many GPUs ``full`` was sized for (:meth:`for_machine`), else None
    sized_for_gpus: int | None = None
    #: arrays of the input's size the run holds at its peak: 2 where the output is held
    #: beside the input (O3, O4), so the footprint is twice :meth:`input_bytes`
    footprint: int = 1
    #: the sides the workload runs on, in order (:mod:`spillway_bench.sides`)
    sides: tuple[str, ...] = ("spillway", "baseline")
    #: the same user code on every side, built under each side's dask settings
    #: (:attr:`spillway_bench.sides.Side.build_config`: spillway's side as
    #: ``spillway.local()`` sets them, ``tasks_method`` with dask's task-based rechunk)
    user_code: bool = False
    #: each side on a freshly started cluster of its own, its first run (no warm-up before
    #: it) recorded as ``first_s`` ahead of the timed runs: what users meet (O3, O4)
    fresh_cluster: bool = False
    #: what is checked against :attr:`reference` where the result is too large to gather:
    #: (the persisted result) -> a tuple of small lazy arrays, computed on the cluster
    #: after the clock stops; None gathers the result (a scalar) itself
    check: Callable[[Any], tuple] | None = None
    #: scale -> (GPU workers) -> the scale's parameters, for a scale whose memory options
    #: are per worker (B3 small: each worker's device, host and disk take the same share)
    worker_sized: Mapping[str, Callable[[int], Mapping[str, Any]]] = field(default_factory=dict)
    #: the least work of the expression, (params) -> {"flops", "hbm_bytes"}, for its compute
    #: bound (:mod:`spillway_bench.bounds`); None where none is declared
    work: Callable[[Mapping[str, Any]], Mapping[str, int]] | None = None

    def for_machine(self, device_bytes: int | None, gpu_workers: int = 0, gpus: int | None = None,
                    host_bytes: int | None = None) -> "Workload":
        """This workload with ``full`` sized for ``gpus`` GPUs of ``device_bytes`` in all,
        where its full size follows the machine (None, on CPU workers: the nominal full
        size), and the scales sized per worker for ``gpu_workers`` (0: CPU workers,
        nominal sizes). ``gpus`` defaults to one per GPU worker (at least one); ``host_bytes``
        (None: unknown) goes to ``machine_sized`` with them (O3 and O4 are capped by it)."""
        sizes = dict(self.sizes)
        if gpu_workers:
            sizes.update({scale: size(gpu_workers) for scale, size in self.worker_sized.items()})
        if self.machine_sized is None or not device_bytes:
            return replace(self, sizes=sizes) if sizes != self.sizes else self
        gpus = max(1, gpus or gpu_workers or 1)
        host = int(host_bytes) if host_bytes else None
        return replace(self, sizes={**sizes, "full": self.machine_sized(int(device_bytes), gpus, host)},
                       sized_from=int(device_bytes), sized_for_gpus=gpus)

    def timed_runs(self, scale: str, runs: int) -> int:
        return min(runs, self.max_runs.get(scale, runs))

    def cluster_changes(self, scale: str, kind: str, side: str) -> dict:
        """Options changes for one side's cluster at ``scale`` on ``kind`` workers (a side
        on spillway's cluster, such as ``tasks_method``, gets spillway's)."""
        if kind != "gpu":
            return {}
        changes = dict(self.gpu_cluster)
        if side != "baseline":
            changes.update(self.spillway_cluster.get(scale, {}))
        return changes

    def params(self, scale: str) -> Mapping[str, Any]:
        if scale not in self.sizes:
            raise ParamError(f"sizes: {scale!r} is not one of {', '.join(SCALES)}")
        return self.sizes[scale]

    def input_bytes(self, scale: str) -> int:
        return data_bytes(self.params(scale))

    def chunk_bytes(self, scale: str) -> int:
        p = self.params(scale)
        return math.prod(p["chunks"]) * np.dtype(p["dtype"]).itemsize

    def footprint_bytes(self, scale: str) -> int:
        """Bytes the run holds at its peak (input and output together where both are)."""
        return self.footprint * self.input_bytes(scale)

    def describe(self, scale: str) -> str:
        p = self.params(scale)
        shape = "x".join(map(str, p["shape"]))
        chunks = "x".join(map(str, p["chunks"]))
        sized = ""
        if scale == "full" and self.sized_from:
            what = "" if self.footprint == 1 else "footprint "
            sized = (f" ({what}{self.footprint_bytes(scale) / self.sized_from:.2f}x the GPUs' "
                     f"{self.sized_from / 1e9:.1f} GB)")
        return f"{self.title} {shape} {p['dtype']}, chunks {chunks}{sized}"

    def build(self, scale: str, target: Target, seed: int, side: str = "spillway") -> Built:
        """The lazy collection one ``side`` ("spillway" or "baseline") computes."""
        params = self.params(scale)
        backend = chunk_backend_for(target.kind)
        if side == "baseline" and self.baseline_direct is not None:
            return Built(self.baseline_direct(params, backend, seed), source="direct (baseline: user code)")
        if side in self.side_direct:
            return Built(self.side_direct[side](params, backend, seed), source=f"direct ({side})")
        built = self._build(params, target, seed, backend)
        if self.then is None:
            return built
        return Built(self.then(built.result), source=built.source, note=built.note)

    def _build(self, params, target: Target, seed: int, backend: str) -> Built:
        note = None
        if self.workflow is not None and self.workflow in workflows.names():
            raw = dict(self.workflow_params(params) if self.workflow_params else {}, seed=seed)
            try:
                _, built = workflows.get(self.workflow).build_run(raw, target)
            except ParamError as e:
                note = f"workflow {self.workflow} rejected {raw}: {e}; built directly"
            else:
                # array workflows add a checksum and a probe to their result: time the array
                result = built.array if getattr(built, "array", None) is not None else built.result
                mismatch = _mismatch(result, params)
                if mismatch is None:
                    return Built(result, source=f"workflow {self.workflow}")
                note = f"workflow {self.workflow} gave {mismatch}; built directly"
        elif self.workflow is not None:
            note = f"workflow {self.workflow} is not registered; built directly"
        result = self.direct(params, backend, seed)
        return Built(result, source="direct", note=note)


def _mismatch(result, params) -> str | None:
    """How a workflow's result differs from the workload's definition (before ``then``:
    ``array_shape`` where the workload has one), or None."""
    shape = tuple(getattr(result, "shape", ()) or ())
    want_shape = tuple(params.get("array_shape", params["out_shape"]))
    if shape != want_shape:
        return f"shape {shape}, expected {want_shape}"
    want = params.get("out_chunks")
    if want is not None and tuple(result.chunksize) != tuple(want):
        return f"chunks {tuple(result.chunksize)}, expected {tuple(want)}"
    return None


# --- parameters by scale


def square(shape, chunks, **extra) -> dict:
    """float64 inputs of ``shape`` reduced to a scalar (``out_shape`` ())."""
    return {"shape": shape, "chunks": chunks, "dtype": "float64", "out_shape": (), **extra}


def same_shape(p, **extra) -> dict:
    """``p`` with an output of the input's shape."""
    return {**p, "out_shape": p["shape"], **extra}


def workflow_size(p) -> dict:
    """The registered workflows' parameters for a workload's shape, chunks and dtype."""
    return {"size": list(p["shape"]), "chunks": list(p["chunks"]), "dtype": p["dtype"]}

