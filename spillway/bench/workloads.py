"""The benchmark workloads W1 ... W5 and B1 ... B5, at three scales.

A workload runs its registered workflow where one is registered and accepts the
workload's parameters; otherwise it builds the same dask expression here, and says so
(``source``), so the benchmark never silently measures something else. Either way the
result is a lazy collection whose root layers are the seeded random inputs: the harness
persists those before the clock starts.

Scales: ``full`` is the issue's definition (GPU host), ``small`` the same shapes scaled
down to minutes on two GPUs, ``tiny`` the CPU smoke run that CI executes.

B3 (out of core: inputs at 1.5 times the GPUs' memory, persisted over device, pinned host
and disk) runs only when named (``--only B3``), on spillway's side only, with its own
memory options per scale, and its result is checked against a NumPy float64 reference.

B4 (``(x @ y).sum()`` of operands that hold 1.3x the GPUs' memory together) and B5 (an
all-to-all rechunk of an array of 1.3x the GPUs' memory, then ``.sum()``) are sized at
``full`` from the GPUs of the machine they run on (:meth:`Workload.for_machine`, applied
when the bench is planned), so one command is out of core on one H100 or four H200s. They
run against the baseline and are checked against NumPy float64 too
(:mod:`.reference`: shortcuts that never form ``x @ y`` or the rechunked array). B5's
baseline is what a user writes for plain dask-cuda, ``x.rechunk(...)`` with dask's default
method (P2P at that size whenever a client is up), which is known to fail there; its
failure is recorded as the baseline's result, not as a failed bench.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from spillway import workflows
from spillway.service.errors import ParamError
from spillway.workflows import random
from spillway.workflows.backend import array_module, backend_for
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
    #: why the baseline is expected to fail: its failure is then recorded as its result
    #: (with the error) and does not fail the bench
    baseline_expected_failure: str | None = None
    #: the issue's speedup target over the baseline, where the workload has one
    speedup_target: float | None = None
    #: ``full`` sized from the machine: (total bytes of the GPUs) -> the scale's parameters
    #: (B4, B5: 1.3x the GPUs' memory, whatever the host)
    machine_sized: Callable[[int], Mapping[str, Any]] | None = None
    #: the GPUs' total bytes ``full`` was sized from (:meth:`for_machine`), else None
    sized_from: int | None = None

    def for_machine(self, device_bytes: int | None) -> "Workload":
        """This workload with ``full`` sized for GPUs of ``device_bytes`` in all, where its
        full size follows the machine (None, on CPU workers: the nominal full size)."""
        if self.machine_sized is None or not device_bytes:
            return self
        return replace(self, sizes={**self.sizes, "full": self.machine_sized(device_bytes)},
                       sized_from=int(device_bytes))

    def timed_runs(self, scale: str, runs: int) -> int:
        return min(runs, self.max_runs.get(scale, runs))

    def cluster_changes(self, scale: str, kind: str, side: str) -> dict:
        """Options changes for one side's cluster at ``scale`` on ``kind`` workers."""
        if kind != "gpu":
            return {}
        changes = dict(self.gpu_cluster)
        if side == "spillway":
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

    def describe(self, scale: str) -> str:
        p = self.params(scale)
        shape = "x".join(map(str, p["shape"]))
        chunks = "x".join(map(str, p["chunks"]))
        sized = ""
        if scale == "full" and self.sized_from:
            sized = f" ({data_bytes(p) / self.sized_from:.2f}x the GPUs' {self.sized_from / 1e9:.1f} GB)"
        return f"{self.title} {shape} {p['dtype']}, chunks {chunks}{sized}"

    def build(self, scale: str, target: Target, seed: int, side: str = "spillway") -> Built:
        """The lazy collection one ``side`` ("spillway" or "baseline") computes."""
        params = self.params(scale)
        backend = backend_for(target.kind)
        if side == "baseline" and self.baseline_direct is not None:
            return Built(self.baseline_direct(params, backend, seed), source="direct (baseline: user code)")
        built = self._build(params, target, seed, backend)
        if self.then is None:
            return built
        return Built(self.then(built.result), source=built.source, note=built.note)

    def _build(self, params, target: Target, seed: int, backend: str) -> Built:
        note = None
        if self.workflow is not None and self.workflow in workflows.names():
            raw = dict(self.workflow_params(params) if self.workflow_params else {}, seed=seed)
            try:
                _, plan = workflows.get(self.workflow).plan(raw, target)
            except ParamError as e:
                note = f"workflow {self.workflow} rejected {raw}: {e}; built directly"
            else:
                # array workflows add a checksum and a probe to their result: time the array
                result = plan.array if getattr(plan, "array", None) is not None else plan.result
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


# --- direct builders (the same expressions the workflows compute)


def _transpose_sum(p, backend, seed):
    x = random.uniform(p["shape"], p["chunks"], seed=seed, dtype=p["dtype"], backend=backend)
    return (x + x.T).sum()


def _matmul(p, backend, seed):
    x = random.uniform(p["shape"], p["chunks"], seed=seed, stream=0, dtype=p["dtype"], backend=backend)
    y = random.uniform(p["shape"], p["chunks"], seed=seed, stream=1, dtype=p["dtype"], backend=backend)
    return x.dot(y)


def _rechunk(p, backend, seed):
    x = random.uniform(p["shape"], p["chunks"], seed=seed, dtype=p["dtype"], backend=backend)
    # P2P rechunking stages shards through host memory and disk; "tasks" keeps chunks
    # on the device and moving between workers, which is what W3 measures
    return x.rechunk(p["to_chunks"], method="tasks")


def complex_block(seed, shape, location, backend):
    real = random.uniform_block(seed, 0, shape, location, "float64", backend)
    imag = random.uniform_block(seed, 1, shape, location, "float64", backend)
    return real + 1j * imag


def complex_uniform(shape, chunks, *, seed: int, backend: str):
    """A seeded complex128 array as one root layer, so it is persisted as an input."""
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    chunks = da.core.normalize_chunks(chunks, shape, dtype=np.complex128)
    name = "complex-uniform-" + tokenize(seed, shape, chunks, backend)
    offsets = [np.cumsum((0,) + c) for c in chunks]
    layer = {}
    for index in np.ndindex(*[len(c) for c in chunks]):
        location = tuple((int(offsets[d][i]), int(offsets[d][i + 1])) for d, i in enumerate(index))
        layer[(name, *index)] = (complex_block, seed, tuple(shape), location, backend)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=())
    return da.Array(graph, name, chunks, meta=np.empty((0,) * len(shape), dtype=np.complex128))


def _fft(p, backend, seed):
    import dask.array as da

    x = complex_uniform(p["shape"], p["chunks"], seed=seed, backend=backend)
    # the transformed axis must be one chunk: gathering it is the all-to-all transfer
    return da.fft.fft(x.rechunk(p["to_chunks"], method="tasks"), axis=0)


def laplacian(block):
    """7-point Laplacian of a block (its one-cell halo is trimmed off afterwards)."""
    xp = array_module("cupy" if type(block).__module__.startswith("cupy") else "numpy")
    out = block * block.dtype.type(-6)
    for axis in range(3):
        lo = [slice(None)] * 3
        hi = [slice(None)] * 3
        lo[axis], hi[axis] = slice(1, None), slice(None, -1)
        out[tuple(lo)] += block[tuple(hi)]
        out[tuple(hi)] += block[tuple(lo)]
    return xp.ascontiguousarray(out)


def _stencil(p, backend, seed):
    x = random.uniform(p["shape"], p["chunks"], seed=seed, dtype=p["dtype"], backend=backend)
    return x.map_overlap(laplacian, depth=1, boundary=0, dtype=p["dtype"])


def _square(shape, chunks, **extra):
    return {"shape": shape, "chunks": chunks, "dtype": "float64", "out_shape": (), **extra}


def _ts_params(p):
    return {"size": list(p["shape"]), "chunks": list(p["chunks"]), "dtype": p["dtype"]}


def _same_shape(p, **extra):
    return {**p, "out_shape": p["shape"], **extra}


WORKLOADS: dict[str, Workload] = {}


def _add(w: Workload):
    WORKLOADS[w.name] = w


_add(Workload(
    name="W1", title="transpose-sum (x + x.T).sum()", workflow="transpose-sum",
    sizes={"full": _square((40000, 40000), (10000, 10000)),
           "small": _square((30000, 30000), (10000, 10000)),
           "tiny": _square((2000, 2000), (500, 500))},
    direct=_transpose_sum, workflow_params=_ts_params,
))
_add(Workload(
    name="W2", title="matmul x.dot(y)", workflow="matmul",
    sizes={"full": _same_shape(_square((20000, 20000), (5000, 5000)), inputs=2),
           "small": _same_shape(_square((10000, 10000), (5000, 5000)), inputs=2),
           "tiny": _same_shape(_square((800, 800), (200, 200)), inputs=2)},
    direct=_matmul,
    workflow_params=lambda p: {"size": list(p["shape"]), "chunks": list(p["chunks"]), "dtype": p["dtype"]},
))
_add(Workload(
    name="W3", title="rechunk rows to columns", workflow="rechunk",
    sizes={"full": _same_shape(_square((80000, 80000), (1000, 80000)), to_chunks=(80000, 1000),
                               out_chunks=(80000, 1000)),
           "small": _same_shape(_square((40000, 40000), (1000, 40000)), to_chunks=(40000, 1000),
                                out_chunks=(40000, 1000)),
           "tiny": _same_shape(_square((2000, 2000), (50, 2000)), to_chunks=(2000, 50),
                               out_chunks=(2000, 50))},
    direct=_rechunk,
    # the workflow's chunks are the panel thickness: rows in, columns out
    workflow_params=lambda p: {"size": list(p["shape"]), "chunks": list(p["chunks"]), "dtype": p["dtype"]},
))
_add(Workload(
    name="W4", title="fft along the chunked axis 0", workflow="fft",
    sizes={"full": _same_shape({"shape": (40000, 40000), "chunks": (5000, 5000), "dtype": "complex128"},
                               to_chunks=(40000, 1000)),
           "small": _same_shape({"shape": (20000, 20000), "chunks": (5000, 5000), "dtype": "complex128"},
                                to_chunks=(20000, 1000)),
           "tiny": _same_shape({"shape": (1024, 1024), "chunks": (256, 256), "dtype": "complex128"},
                               to_chunks=(1024, 64))},
    direct=_fft,
    workflow_params=lambda p: {"size": list(p["shape"]), "chunks": list(p["chunks"]), "dtype": p["dtype"]},
))
_add(Workload(
    name="W5", title="3-D 7-point stencil", workflow="stencil",
    sizes={"full": _same_shape({"shape": (2048,) * 3, "chunks": (512,) * 3, "dtype": "float32"}),
           "small": _same_shape({"shape": (1024,) * 3, "chunks": (512,) * 3, "dtype": "float32"}),
           "tiny": _same_shape({"shape": (64,) * 3, "chunks": (32,) * 3, "dtype": "float32"})},
    direct=_stencil,
    workflow_params=lambda p: {"ndim": 3, "depth": 1, "size": list(p["shape"]), "chunks": list(p["chunks"]),
                               "dtype": p["dtype"]},
))
_add(Workload(
    name="B1", title="transpose-sum beyond device memory", workflow="transpose-sum",
    sizes={"full": _square((160000, 160000), (10000, 10000)),
           "small": _square((100000, 100000), (10000, 10000)),
           "tiny": _square((3000, 3000), (500, 500))},
    direct=_transpose_sum, workflow_params=_ts_params,
))
_add(Workload(
    name="B2", title="transpose-sum, 12 GB device limit", workflow="transpose-sum",
    sizes={"full": _square((80000, 80000), (10000, 10000)),
           "small": _square((60000, 60000), (10000, 10000)),
           "tiny": _square((2000, 2000), (500, 500))},
    direct=_transpose_sum, workflow_params=_ts_params,
    gpu_cluster={"device_memory_limit": "12GB"},
    speedup_target=5.0,
))


def _b3_reference(p, seed):
    from .reference import transpose_sum

    return transpose_sum(p["shape"], seed, p["dtype"])


_add(Workload(
    name="B3", title="transpose-sum out of core (inputs over device, host and disk)",
    workflow="transpose-sum",
    # 1.5x the GPUs' memory at full size (423.2 GB on 2 x H200): per worker the device
    # holds up to its limit, the pinned host pool the next part, disk the rest
    sizes={"full": _square((230000, 230000), (10000, 10000)),
           "small": _square((120000, 120000), (10000, 10000)),
           "tiny": _square((2400, 2400), (400, 400))},
    direct=_transpose_sum, workflow_params=_ts_params,
    spillway_cluster={
        # the RMM pool (90%, spillway's default) must hold the 125 GB the device tier may fill;
        # 48 GB pinned per worker keeps both workers' pools under half the 270 GB host
        # (at 80 GB each the kernel's OOM killer ended the workers as they started)
        "full": {"device_memory_limit": "125GB", "memory_limit": "48GB", "pinned_pool_size": "48GB",
                 "rmm_pool_size": 0.9},
        "small": {"device_memory_limit": "30GB", "memory_limit": "20GB", "pinned_pool_size": "20GB"},
    },
    baseline_skip=("not run: plain LocalCUDACluster fails at this size (at B1's 204.8 GB its workers "
                   "already died of CUDA out of memory on the 2 x H200 host)"),
    default=False, warmup=False, reference=_b3_reference,
    # one run at full size persists 423 GB and moves ~320 GB through the tiers, over 2
    # minutes on the 2 x H200 host: one checked run is what a 10-minute device call holds
    max_runs={"full": 1},
))


def _b4_reference(p, seed):
    from .reference import matmul_sum

    return matmul_sum(p["shape"], seed, p["dtype"])


def _sum(array):
    return array.sum()


def _matmul_square(shape, chunks):
    return _square(shape, chunks, inputs=2, array_shape=shape)


#: B4's operands together and B5's array at this times the GPUs' memory at full size
OUT_OF_CORE_FACTOR = 1.3
#: full-size sides are rounded up to a multiple of this
SIDE_STEP = 1000


def side_for(nbytes: float, arrays: int = 1, itemsize: int = 8) -> int:
    """The side of ``arrays`` square arrays holding at least ``nbytes`` together, rounded
    up to a multiple of :data:`SIDE_STEP`."""
    side = math.sqrt(nbytes / (arrays * itemsize))
    return max(SIDE_STEP, math.ceil(side / SIDE_STEP) * SIDE_STEP)


def b4_full(device_bytes: int) -> dict:
    """x and y square float64 holding 1.3x the GPUs' memory together, chunks 10000^2."""
    n = side_for(OUT_OF_CORE_FACTOR * device_bytes, arrays=2)
    return _matmul_square((n, n), (min(n, 10000),) * 2)


_add(Workload(
    name="B4", title="(x @ y).sum() beyond the GPUs' memory", workflow="matmul",
    # full: x and y together 1.3x the GPUs' memory (84000^2 each, 112.9 GB, on one H100 80 GB;
    # 157000^2 on 2 x H200), chunks 10000^2; the nominal 100000^2 is what runs without GPUs
    sizes={"full": _matmul_square((100000, 100000), (10000, 10000)),
           "small": _matmul_square((40000, 40000), (10000, 10000)),
           "tiny": _matmul_square((1200, 1200), (300, 300))},
    machine_sized=b4_full,
    direct=_matmul, then=_sum,
    workflow_params=lambda p: {"size": list(p["shape"]), "chunks": list(p["chunks"]), "dtype": p["dtype"]},
    default=False, reference=_b4_reference, speedup_target=1.5,
    # plain dask-cuda ran out of device memory on (x @ y).sum() of 70000^2 operands on one
    # H100 (the matrix's user-code matmul): recorded as its result, the target then being
    # that spillway completes with NumPy's answer
    baseline_expected_failure="plain dask-cuda ran out of device memory on (x @ y).sum() past the GPU "
                              "(70000^2 operands on one H100 80 GB)",
    # at full size one run takes about a minute on each side, the reference another: a
    # warm-up and one checked run per side is what a 10-minute device call holds
    max_runs={"full": 1},
))


def _b5_reference(p, seed):
    from .reference import array_sum

    # a rechunk moves values, it changes none: the sum is the input's, whatever the chunks
    return array_sum(p["shape"], seed, p["dtype"])


def _rechunk_sum_user(p, backend, seed):
    """What a user writes for plain dask-cuda: dask's default rechunk method, which is P2P
    for an all-to-all of this many panels whenever a distributed client is up."""
    x = random.uniform(p["shape"], p["chunks"], seed=seed, dtype=p["dtype"], backend=backend)
    return x.rechunk(p["to_chunks"]).sum()


def _panels_square(n, rows):
    return _square((n, n), (rows, n), array_shape=(n, n), to_chunks=(n, rows), out_chunks=(n, rows))


def b5_full(device_bytes: int) -> dict:
    """A square float64 array of 1.3x the GPUs' memory, 1000-row panels to 1000-column panels."""
    return _panels_square(side_for(OUT_OF_CORE_FACTOR * device_bytes), 1000)


_add(Workload(
    name="B5", title="rechunk row panels to column panels, then .sum()", workflow="rechunk",
    # full: 1.3x the GPUs' memory (118000^2 float64, 111.4 GB, on one H100 80 GB; 222000^2 on
    # 2 x H200) in 1000-row panels to 1000-column panels; the nominal 158113^2 (200 GB) is
    # what runs without GPUs
    sizes={"full": _panels_square(158113, 1000),
           "small": _panels_square(60000, 1000),
           "tiny": _panels_square(2000, 50)},
    machine_sized=b5_full,
    direct=_rechunk, then=_sum, baseline_direct=_rechunk_sum_user,
    workflow_params=lambda p: {"size": list(p["shape"]), "chunks": list(p["chunks"]), "dtype": p["dtype"]},
    baseline_expected_failure=("plain dask-cuda with dask's default (P2P) rechunk failed on the GPU host: "
                               "\"P2P ... failed during transfer phase\""),
    default=False, reference=_b5_reference, max_runs={"full": 1},
))


def select(only: str | None) -> list[Workload]:
    """Workloads named in ``only`` ("W1,B2"), in catalogue order; None or "" for the
    default set (all but B3, B4 and B5)."""
    if not only:
        return [w for w in WORKLOADS.values() if w.default]
    names = [n.strip().upper() for n in only.split(",") if n.strip()]
    for n in names:
        if n not in WORKLOADS:
            raise ParamError(f"only: {n!r} is not a workload (known: {', '.join(WORKLOADS)})")
    return [w for w in WORKLOADS.values() if w.name in names]
