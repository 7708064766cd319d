"""The out-of-core matrix: every computation on the cluster past the GPUs' memory.

Each case is one computation at a size whose projected footprint is at least ``factor``
(1.3 on the GPU host) times the GPUs' memory, run one of three ways:

- ``cli``: a catalogue workflow with seeded inputs through ``spillway run --verify --json``
  in a subprocess (its own cluster, from the defaults);
- ``notebook``: the same workflow on ``service.local()``, its input generated from the
  seed and persisted by the user first (``client.persist``), then handed to the workflow
  as an array input and computed through the notebook's ``compute``;
- ``user-code``: dask code a user writes on persisted inputs (tall-skinny QR, SVD and
  least squares, a matmul, ``map_overlap``, reductions, a rechunk with dask's defaults).

Every case ends with its answer checked against a NumPy float64 reference computed on
the host from the seeds (relative error), or refused by admission before it starts with
the projected footprint and the cluster's capacity. :func:`write_table` writes the rows
as ``<machine>-<date>-ooc-matrix.{json,md,png}`` (the PNG through the bench's writer), and
merges rows into a file of the same name, so the matrix can run in slices.

The scale is a parameter (:class:`Scale`): the GPUs' memory from NVML on the GPU host,
or a small stand-in for the CPU tests.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

PATHS = ("cli", "notebook", "user-code")
#: the issue's scale: projected footprint at least this times the GPUs' memory
GPU_FACTOR = 1.3
#: relative error a user-code answer may have (workflows carry their own tolerances)
TOLERANCE = 1e-10
#: least squares is checked against the normal equations, which square the condition
#: number (about sqrt(3 n) for uniform inputs): a looser bound
LSTSQ_TOLERANCE = 1e-8
#: the sizing search stops above the target by at most this share
SIZE_SLACK = 1.02
SEED = 4242


@dataclass(frozen=True)
class Scale:
    """How large the cases are: ``factor`` times ``device_bytes`` of projected footprint."""

    device_bytes: int
    kind: str = "gpu"
    n_workers: int = 2
    #: memory one worker holds before it spills (device limit on GPUs): sets auto chunks
    worker_bytes: int = 4 * 2**30
    factor: float = GPU_FACTOR

    @property
    def target_bytes(self) -> int:
        return math.ceil(self.factor * self.device_bytes)

    def target(self):
        from workflows.params import Target

        return Target(kind=self.kind, n_workers=self.n_workers, worker_bytes=self.worker_bytes)


def gpu_scale(factor: float = GPU_FACTOR, inventory=None) -> Scale:
    """The GPUs' memory from NVML (the visible GPUs), one worker each, spillway's default
    device limit (80% of a GPU) per worker."""
    from ..gpus import discover

    inventory = discover() if inventory is None else inventory
    sizes = [g.memory_total for g in inventory.gpus]
    if not sizes:
        raise RuntimeError("no GPU visible: the GPU matrix needs the GPU host")
    return Scale(device_bytes=sum(sizes), kind="gpu", n_workers=len(sizes), worker_bytes=int(0.8 * min(sizes)),
                 factor=factor)


def cpu_scale(device_bytes: int = 48 * 2**20, n_workers: int = 2, factor: float = GPU_FACTOR) -> Scale:
    """A small stand-in for the GPUs' memory, for CPU workers."""
    return Scale(device_bytes=device_bytes, kind="cpu", n_workers=n_workers,
                 worker_bytes=max(2**20, device_bytes // n_workers), factor=factor)


# --- the cases


@dataclass(frozen=True)
class Case:
    workflow: str
    path: str
    #: workflow parameters other than size and seed
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.path}-{self.workflow}"


def catalogue() -> list[str]:
    import workflows

    return workflows.names()


def cases() -> list[Case]:
    """Every catalogue workflow on the cli and notebook paths, then the user-code cases.
    The cli cases come first: each starts its own cluster, which must not share the GPUs
    with the notebook's."""
    names = catalogue()
    return ([Case(n, "cli") for n in names] + [Case(n, "notebook") for n in names]
            + [Case(n, "user-code") for n in USER_CODE])


def case_by_id(case_id: str) -> Case:
    for c in cases():
        if c.id == case_id:
            return c
    raise KeyError(case_id)


# --- sizing


def grow(footprint_of: Callable[[int], int], target: int, start: int) -> int:
    """The smallest size (within :data:`SIZE_SLACK`) whose ``footprint_of`` reaches
    ``target``: footprints grow about linearly with size, so a few proportional steps."""
    size = max(1, start)
    for _ in range(8):
        fp = footprint_of(size)
        if target <= fp <= SIZE_SLACK * target:
            return size
        size = max(1, int(size * target * (1 + (SIZE_SLACK - 1) / 2) / max(1, fp)))
    while footprint_of(size) < target:
        size = int(size * 1.01) + 1
    return size


def workflow_params(case: Case, scale: Scale, seed: int = SEED, target=None) -> tuple[dict, int]:
    """Raw parameters of a workflow case: ``size`` in bytes so that the projected
    footprint is at least the scale's target, on ``target`` (a running cluster's; else the
    scale's, which is what ``spillway run`` sees on the GPU host: auto chunks follow it);
    and that projected footprint."""
    import workflows

    workflow = workflows.get(case.workflow)
    target = target or scale.target()

    def footprint_of(size: int) -> int:
        raw = {**case.params, "size": f"{size}B", "seed": seed}
        return workflow.plan(raw, target)[1].footprint.total_bytes

    size = grow(footprint_of, scale.target_bytes, scale.target_bytes // 2)
    return {**case.params, "size": f"{size}B", "seed": seed}, footprint_of(size)


def seeded_inputs(plan) -> dict[str, tuple]:
    """``{input name: (shape, chunks, dtype, stream)}`` of a plan's seeded inputs, read from
    the root layers of its graph (the generator's tasks name shape, location and stream),
    so a user can generate and persist exactly the arrays the workflow would have."""
    from dask.highlevelgraph import HighLevelGraph

    from workflows import random

    collections = plan.result if isinstance(plan.result, tuple) else (plan.result,)
    found: dict[int, tuple] = {}
    for c in collections:
        graph = c.__dask_graph__()
        if not isinstance(graph, HighLevelGraph):
            continue
        for name, deps in graph.dependencies.items():
            if deps or not name.startswith("uniform-"):
                continue
            tasks = [t for t in graph.layers[name].values() if isinstance(t, tuple) and t[0] is random.uniform_block]
            if not tasks:
                continue
            _, _, stream, shape, _, dtype, *_ = tasks[0]
            bounds = [sorted({t[4][d] for t in tasks}) for d in range(len(shape))]
            chunks = tuple(tuple(b - a for a, b in axis) for axis in bounds)
            found[stream] = (tuple(shape), chunks, dtype, stream)
    names = {0: "x", 1: "y"}
    return {names[s]: v for s, v in sorted(found.items())}


# --- running one case


def row(case: Case, scale: Scale, **values) -> dict:
    out = {"case": case.id, "workflow": case.workflow, "path": case.path, "footprint_bytes": None,
           "device_bytes": scale.device_bytes, "factor": scale.factor, "ok": False, "rel_error": None,
           "tolerance": None, "wall_s": None, "spilled_bytes": None, "refused": False, "error": None}
    out.update(values)
    return out


def run_cli(case: Case, scale: Scale, *, cluster_args: tuple[str, ...] = (), timeout: float = 540,
            python: str = sys.executable, seed: int = SEED) -> dict:
    """``spillway run WORKFLOW --verify --json`` in a subprocess; its report gives the row."""
    params, projected = workflow_params(case, scale, seed)
    command = [python, "-m", "service", "run", case.workflow, "--verify", "--json", "--no-progress",
               *[a for k, v in params.items() for a in ("--param", f"{k}={v}")], *cluster_args]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return row(case, scale, params=params, error=f"timed out after {timeout:.0f} s")
    elapsed = time.perf_counter() - t0
    last = (done.stderr.strip().splitlines() or [""])[-1]
    report = None
    for line in reversed(done.stdout.strip().splitlines()):
        if line.startswith("{"):
            report = json.loads(line)
            break
    if report is None:
        # exit status 3: refused by admission, with both numbers, before anything started
        return row(case, scale, params=params, footprint_bytes=projected, refused=done.returncode == 3,
                   process_s=elapsed,
                   error=last or f"exit status {done.returncode}")
    v = report.get("verify") or {}
    return row(case, scale, params=params, footprint_bytes=report["footprint"]["total_bytes"],
               ok=bool(v.get("ok")) and done.returncode == 0, rel_error=v.get("rel_error"),
               tolerance=v.get("tolerance"), wall_s=report["wall_s"], spilled_bytes=report["bytes_spilled"],
               reference=v.get("reference"), process_s=elapsed,
               error=None if done.returncode == 0 else (last or f"exit status {done.returncode}"))


def _persist(client, arrays: dict) -> dict:
    from distributed import wait

    persisted = {k: client.persist(v) for k, v in arrays.items()}
    wait([f for v in persisted.values() for f in _futures(v)])
    return persisted


def _futures(collection):
    from distributed import futures_of

    return futures_of(collection)


def _measured(cluster, collections: tuple) -> tuple[Any, float, int]:
    """Compute on the cluster: (values, wall seconds, bytes spilled device -> host and
    host -> disk meanwhile)."""
    from ..plugins import worker_snapshot
    from ..runner import transfer_stats

    client = cluster.client
    before = client.run(worker_snapshot)
    start_wall = time.time()
    t0 = time.perf_counter()
    values = cluster.compute(*collections, progress=False)
    wall = time.perf_counter() - t0
    after = client.run(worker_snapshot)
    spilled = transfer_stats(before, after, start_wall=start_wall)["bytes_spilled"]
    return values, wall, spilled


def _admit(cluster, name: str, footprint) -> None:
    from ..memory.admission import admit, cluster_capacity

    admit(name, footprint, cluster_capacity(cluster.client))


def run_notebook(case: Case, scale: Scale, cluster, *, seed: int = SEED) -> dict:
    """On ``cluster`` (a :func:`service.local` cluster): generate the workflow's inputs from
    the seed, persist them as a user would, hand them to the workflow, compute its graph
    through the notebook's ``compute`` and check against the seeded reference."""
    import workflows

    from ..errors import AdmissionError
    from ..runner import target_of
    from workflows import random
    from workflows.backend import backend_for
    from workflows.registry import relative_error

    workflow = workflows.get(case.workflow)
    target = target_of(cluster.session)
    params, _ = workflow_params(case, scale, seed, target)
    _, seeded = workflow.plan(params, target)
    backend = backend_for(cluster.kind)
    wanted = seeded_inputs(seeded)
    try:
        # the projected footprint is the workflow's whatever the input's source
        _admit(cluster, case.workflow, seeded.footprint)
    except AdmissionError as e:
        return row(case, scale, params=params, footprint_bytes=seeded.footprint.total_bytes, refused=True,
                   error=str(e))
    arrays = {name: random.uniform(shape, chunks, seed=seed, stream=stream, dtype=dtype, backend=backend)
              for name, (shape, chunks, dtype, stream) in wanted.items()}
    persisted = _persist(cluster.client, arrays)
    try:
        _, plan = workflow.plan(params, target, arrays=persisted)
        # a plan's result is one collection or a tuple of them; compute returns the same shape
        collections = plan.result if isinstance(plan.result, tuple) else (plan.result,)
        value, wall, spilled = _measured(cluster, collections)
        expected, how = seeded.reference(value)
        err = float(relative_error(plan.checked(value), expected))
        return row(case, scale, params=params, footprint_bytes=plan.footprint.total_bytes,
                   ok=err <= plan.tolerance, rel_error=err, tolerance=plan.tolerance, wall_s=wall,
                   spilled_bytes=spilled, reference=how, inputs={k: list(v[0]) for k, v in wanted.items()},
                   error=None if err <= plan.tolerance else f"relative error {err:.3e} above {plan.tolerance:.0e}")
    except Exception as e:  # a failed case is a row of the table, not the end of the matrix
        return row(case, scale, params=params, footprint_bytes=seeded.footprint.total_bytes,
                   error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    finally:
        del persisted


# --- user-written dask code


@dataclass
class UserBuilt:
    """One user-code case at a size: its persisted-input arrays, lazy results, projected
    footprint and check."""

    inputs: dict
    results: Callable[[dict], tuple]
    footprint: Any
    #: (computed values) -> relative error against the NumPy float64 reference
    check: Callable[[tuple], float]
    tolerance: float = TOLERANCE
    reference: str = ""


def _square_chunk(nbytes: int, kind: str) -> int:
    """Side of square float64 chunks: 10000 (800 MB) on GPUs, about 1/16 of the array on CPU."""
    if kind == "gpu":
        return 10000
    return max(16, int(math.sqrt(nbytes / 16 / 8)))


def _panel_rows(rows: int, cols: int, kind: str) -> int:
    """Rows of tall-skinny panels: 512 MiB on GPUs, about 1/16 of the array on CPU."""
    per = (512 * 2**20 if kind == "gpu" else rows * cols * 8 // 16) // (cols * 8)
    return max(cols, min(rows, per))


def _rel(computed, expected) -> float:
    from workflows.registry import relative_error

    return float(relative_error(computed, np.asarray(expected, dtype=np.float64)))


TALL_COLUMNS = 32


def _tall(nbytes: int, kind: str, seed: int, backend: str, *, with_b: bool = False):
    from workflows import random

    rows = max(TALL_COLUMNS, nbytes // (TALL_COLUMNS * 8))
    panel = _panel_rows(rows, TALL_COLUMNS, kind)
    x = random.uniform((rows, TALL_COLUMNS), (panel, TALL_COLUMNS), seed=seed, backend=backend)
    inputs = {"x": x}
    if with_b:
        inputs["b"] = random.uniform((rows,), (panel,), seed=seed, stream=1, backend=backend)
    return rows, panel, inputs


def _fp(input_bytes, output_bytes, chunk_bytes, n_workers, temporaries):
    from workflows.results import footprint

    return footprint(input_bytes, output_bytes, chunk_bytes, n_workers, temporaries=temporaries)


def _abs_r(r):
    from workflows.backend import to_numpy

    return np.abs(np.asarray(to_numpy(r), dtype=np.float64))


def user_qr(nbytes, scale, seed, backend):
    import dask.array as da

    from .reference import gram

    rows, panel, inputs = _tall(nbytes, scale.kind, seed, backend)
    shape = (rows, TALL_COLUMNS)

    def results(x):
        q, r = da.linalg.qr(x["x"])
        return r, (q.T @ q)

    def check(values):
        g = gram(shape, seed)
        r_ref = np.linalg.cholesky(g).T  # R.T @ R = x.T @ x, R up to the signs of its rows
        return _rel(_abs_r(values[0]), np.abs(r_ref))

    size = rows * TALL_COLUMNS * 8
    return UserBuilt(inputs, results, _fp(size, size, panel * TALL_COLUMNS * 8, scale.n_workers, 4), check,
                     reference="|R| against the Cholesky factor of x.T @ x (float64, from the seed)")


def user_svd(nbytes, scale, seed, backend):
    import dask.array as da

    from .reference import gram

    rows, panel, inputs = _tall(nbytes, scale.kind, seed, backend)
    shape = (rows, TALL_COLUMNS)

    def results(x):
        u, s, v = da.linalg.svd(x["x"])
        return s, u.sum()

    def check(values):
        from workflows.backend import to_numpy

        expected = np.sqrt(np.linalg.eigvalsh(gram(shape, seed)))[::-1]
        return _rel(np.sort(np.asarray(to_numpy(values[0]), dtype=np.float64))[::-1], expected)

    size = rows * TALL_COLUMNS * 8
    return UserBuilt(inputs, results, _fp(size, size, panel * TALL_COLUMNS * 8, scale.n_workers, 4), check,
                     reference="singular values against sqrt(eig(x.T @ x)) (float64, from the seed)")


def user_lstsq(nbytes, scale, seed, backend):
    import dask.array as da

    from .reference import panel_stats

    rows, panel, inputs = _tall(nbytes, scale.kind, seed, backend, with_b=True)
    shape = (rows, TALL_COLUMNS)

    def results(x):
        coef, residuals, rank, sv = da.linalg.lstsq(x["x"], x["b"])
        return (coef,)

    def check(values):
        from workflows.backend import to_numpy

        stats = panel_stats(shape, seed, wanted=("gram", "xtb"), b_stream=1)
        expected = np.linalg.solve(stats["gram"], stats["xtb"])
        return _rel(np.asarray(to_numpy(values[0]), dtype=np.float64), expected)

    size = rows * TALL_COLUMNS * 8
    return UserBuilt(inputs, results, _fp(size + rows * 8, size, panel * TALL_COLUMNS * 8, scale.n_workers, 4),
                     check, tolerance=LSTSQ_TOLERANCE,
                     reference="coefficients against the normal equations (x.T @ x) c = x.T @ b (float64)")


def _square(nbytes, scale, seed, backend, *, streams=(0,)):
    from workflows import random

    n = max(4, int(math.sqrt(nbytes / 8)))
    c = min(n, _square_chunk(n * n * 8, scale.kind))
    arrays = {name: random.uniform((n, n), (c, c), seed=seed, stream=s, backend=backend)
              for name, s in zip(("x", "y"), streams)}
    return n, c, arrays


def user_matmul(nbytes, scale, seed, backend):
    from .reference import matmul_sum

    n, c, inputs = _square(nbytes, scale, seed, backend, streams=(0, 1))

    def results(x):
        return ((x["x"] @ x["y"]).sum(),)

    def check(values):
        return _rel(values[0], matmul_sum((n, n), seed))

    a = n * n * 8
    return UserBuilt(inputs, results, _fp(2 * a, a, c * c * 8, scale.n_workers, 4), check,
                     reference="sum_k colsum(x)[k] * rowsum(y)[k] (float64, from the seed)")


def laplacian_2d(block):
    """5-point Laplacian of a block with its halo (trimmed off by map_overlap)."""
    out = block * block.dtype.type(-4)
    out[1:, :] += block[:-1, :]
    out[:-1, :] += block[1:, :]
    out[:, 1:] += block[:, :-1]
    out[:, :-1] += block[:, 1:]
    return out


def _probe(n: int, c: int, width: int = 64) -> tuple[slice, slice]:
    """A window across the first chunk boundary (or the middle of one chunk)."""
    from workflows.results import window

    boundary = c if n > c else n // 2
    return window(n, boundary, width), window(n, boundary, width)


def user_map_overlap(nbytes, scale, seed, backend):
    from workflows import random

    n, c, inputs = _square(nbytes, scale, seed, backend)
    rows, cols = _probe(n, c)

    def results(x):
        y = x["x"].map_overlap(laplacian_2d, depth=1, boundary=0)
        return y.sum(), y[rows, cols]

    def region(r0, r1, c0, c1):
        return random.uniform_block(seed, 0, (n, n), ((r0, r1), (c0, c1)), "float64", "numpy")

    def check(values):
        from workflows.backend import to_numpy

        # the sum of a Laplacian with zeros outside is minus the sums of the four edges
        edges = region(0, 1, 0, n).sum() + region(n - 1, n, 0, n).sum() \
            + region(0, n, 0, 1).sum() + region(0, n, n - 1, n).sum()
        r0, r1 = max(0, rows.start - 1), min(n, rows.stop + 1)
        c0, c1 = max(0, cols.start - 1), min(n, cols.stop + 1)
        padded = np.pad(region(r0, r1, c0, c1), 1)  # zeros past the array's edges
        lap = laplacian_2d(padded)[1:-1, 1:-1]
        window = lap[rows.start - r0:rows.stop - r0, cols.start - c0:cols.stop - c0]
        return max(_rel(values[0], -edges), _rel(np.asarray(to_numpy(values[1]), dtype=np.float64), window))

    a = n * n * 8
    return UserBuilt(inputs, results, _fp(a, a, (c + 2) ** 2 * 8, scale.n_workers, 4), check,
                     reference="minus the edge sums, and a window across chunk boundaries (float64, from the seed)")


def user_reductions(nbytes, scale, seed, backend):
    from .reference import panel_stats

    n, c, inputs = _square(nbytes, scale, seed, backend)

    def results(x):
        return x["x"].mean(axis=0), x["x"].std()

    def check(values):
        from workflows.backend import to_numpy

        stats = panel_stats((n, n), seed, wanted=("sum", "sumsq", "colsum"))
        count = n * n
        mean = stats["sum"] / count
        std = math.sqrt(stats["sumsq"] / count - mean * mean)
        return max(_rel(np.asarray(to_numpy(values[0]), dtype=np.float64), stats["colsum"] / n),
                   _rel(values[1], std))

    a = n * n * 8
    return UserBuilt(inputs, results, _fp(a, 0, c * c * 8, scale.n_workers, 2), check,
                     reference="column means and std from float64 column sums, sum and sum of squares")


def user_rechunk(nbytes, scale, seed, backend):
    from workflows import random

    from .reference import array_sum

    n = max(4, int(math.sqrt(nbytes / 8)))
    panel = max(1, min(n, (1000 if scale.kind == "gpu" else max(1, n // 16))))
    inputs = {"x": random.uniform((n, n), (panel, n), seed=seed, backend=backend)}
    rows, cols = _probe(n, panel, 256)

    def results(x):
        # what a user writes: dask's default method (P2P for an all-to-all with a client up)
        y = x["x"].rechunk((n, panel))
        return y.sum(), y[rows, cols]

    def check(values):
        from workflows.backend import to_numpy

        window = random.uniform_block(seed, 0, (n, n), ((rows.start, rows.stop), (cols.start, cols.stop)),
                                      "float64", "numpy")
        return max(_rel(values[0], array_sum((n, n), seed)),
                   _rel(np.asarray(to_numpy(values[1]), dtype=np.float64), window))

    a = n * n * 8
    return UserBuilt(inputs, results, _fp(a, a, panel * n * 8, scale.n_workers, 3), check,
                     reference="the input's sum and a window of its values (float64, from the seed)")


#: user-code cases: (nbytes of input, scale, seed, backend) -> UserBuilt
USER_CODE: dict[str, Callable] = {
    "qr": user_qr, "svd": user_svd, "lstsq": user_lstsq, "matmul": user_matmul,
    "map_overlap": user_map_overlap, "reductions": user_reductions, "rechunk": user_rechunk,
}


def user_size(case: Case, scale: Scale, seed: int = SEED) -> int:
    """Input bytes of a user-code case whose projected footprint reaches the target."""
    build = USER_CODE[case.workflow]
    return grow(lambda n: build(n, scale, seed, "numpy").footprint.total_bytes, scale.target_bytes,
                scale.target_bytes // 2)


def run_user_code(case: Case, scale: Scale, cluster, *, seed: int = SEED) -> dict:
    """User-written dask code on inputs the user persisted first, on ``cluster``."""
    from ..errors import AdmissionError
    from workflows.backend import backend_for

    nbytes = user_size(case, scale, seed)
    built = USER_CODE[case.workflow](nbytes, scale, seed, backend_for(cluster.kind))
    fp = built.footprint.total_bytes
    try:
        _admit(cluster, case.workflow, built.footprint)
    except AdmissionError as e:
        return row(case, scale, footprint_bytes=fp, refused=True, error=str(e))
    persisted = _persist(cluster.client, built.inputs)
    try:
        values, wall, spilled = _measured(cluster, built.results(persisted))
        values = values if isinstance(values, tuple) else (values,)
        err = built.check(values)
        ok = err <= built.tolerance
        return row(case, scale, footprint_bytes=fp, ok=ok, rel_error=err, tolerance=built.tolerance, wall_s=wall,
                   spilled_bytes=spilled, reference=built.reference,
                   inputs={k: list(v.shape) for k, v in built.inputs.items()},
                   error=None if ok else f"relative error {err:.3e} above {built.tolerance:.0e}")
    except Exception as e:
        return row(case, scale, footprint_bytes=fp,
                   error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    finally:
        del persisted


def run_case(case: Case, scale: Scale, *, cluster=None, **kwargs) -> dict:
    """One case on its path (``cluster`` for the notebook and user-code paths)."""
    if case.path == "cli":
        return run_cli(case, scale, **kwargs)
    if cluster is None:
        raise ValueError(f"{case.id}: the {case.path} path runs on a service.local() cluster")
    runner = run_notebook if case.path == "notebook" else run_user_code
    return runner(case, scale, cluster, **kwargs)


# --- the table


def stem(machine: str, when: datetime | None = None) -> str:
    when = when or datetime.now(timezone.utc)
    return f"{machine}-{when:%Y-%m-%d}-ooc-matrix"


def write_table(rows: list[dict], out_dir: Path, machine: str, *, when: datetime | None = None,
                merge: bool = True) -> dict[str, Path]:
    """``<machine>-<date>-ooc-matrix.{json,md,png}`` in ``out_dir``; rows of an earlier
    slice in the same file are kept unless this run has the same case."""
    from . import report

    name = stem(machine, when)
    path = out_dir / f"{name}.json"
    by_case = {}
    if merge and path.exists():
        by_case = {r["case"]: r for r in json.loads(path.read_text()).get("cases", [])}
    by_case.update({r["case"]: r for r in rows})
    order = {c.id: i for i, c in enumerate(cases())}
    ordered = sorted(by_case.values(), key=lambda r: (order.get(r["case"], len(order)), r["case"]))
    results = {"machine": machine, "cases": ordered}
    return report.write(results, out_dir, name, render=markdown, draw=plot)


def _gb(v) -> str:
    from ..sizes import format_bytes

    return "—" if v is None else format_bytes(v)


def markdown(results: dict) -> str:
    rows = results["cases"]
    done = sum(1 for r in rows if r["ok"])
    refused = sum(1 for r in rows if r["refused"])
    lines = [f"# spillway out-of-core matrix: {results['machine']}", "",
             f"{len(rows)} cases: {done} gave NumPy's answer, {refused} refused by admission, "
             f"{len(rows) - done - refused} failed. Footprint is the projected one; device is the GPUs' memory "
             "(or the CPU stand-in).", "",
             "| case | path | footprint | device | x device | ok | relative error | wall s | spilled | error |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        ratio = (f"{r['footprint_bytes'] / r['device_bytes']:.2f}"
                 if r.get("footprint_bytes") and r.get("device_bytes") else "—")
        status = "yes" if r["ok"] else "refused" if r["refused"] else "no"
        err = "—" if r["rel_error"] is None else f"{r['rel_error']:.1e}"
        wall = "—" if r["wall_s"] is None else f"{r['wall_s']:.2f}"
        lines.append(f"| {r['workflow']} | {r['path']} | {_gb(r['footprint_bytes'])} | {_gb(r['device_bytes'])} "
                     f"| {ratio} | {status} | {err} | {wall} | {_gb(r['spilled_bytes'])} "
                     f"| {(r['error'] or '').replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    """Wall time per case, coloured by path; failed and refused cases marked at zero."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["cases"]
    colours = {"cli": "tab:blue", "notebook": "tab:orange", "user-code": "tab:green"}
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(rows) + 2), 4.5))
    x = np.arange(len(rows))
    ax.bar(x, [r["wall_s"] or 0 for r in rows], color=[colours.get(r["path"], "grey") for r in rows])
    for i, r in enumerate(rows):
        if not r["ok"]:
            ax.annotate("refused" if r["refused"] else "failed", (i, 0), rotation=90, ha="center", va="bottom",
                        fontsize=7, color="red")
    ax.set_xticks(x, [r["case"] for r in rows], rotation=75, ha="right", fontsize=7)
    ax.set_ylabel("wall time (s)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, list(colours), fontsize=8)
    ax.set_title(f"out-of-core matrix on {results['machine']}: wall time per case")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
