"""One case of the matrix on its path (``cli``: ``spillway run --verify --json`` in a
subprocess; ``notebook``: the workflow on ``spillway.local()`` over inputs the user
persisted; ``user-code``: :mod:`.user_code`; ``service``, ``batch``: :mod:`.entry`), and its
row: the bytes of each move between tiers and its copy bound next to its time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from .. import bounds
from .cases import Case, seeded_inputs, workflow_params
from .rows import report_row, row
from .scale import SEED, Scale
from .user_code import USER_CODE, user_size


def run_cli(case: Case, scale: Scale, *, cluster_args: tuple[str, ...] = (), timeout: float = 540,
            python: str = sys.executable, seed: int = SEED) -> dict:
    """``spillway run WORKFLOW --verify --json`` in a subprocess; its report gives the row."""
    params, projected = workflow_params(case, scale, seed)
    command = [python, "-m", "spillway", "run", case.workflow, "--verify", "--json", "--no-progress",
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
    return report_row(case, scale, params, report, exited_ok=done.returncode == 0, process_s=elapsed,
                      error=None if done.returncode == 0 else (last or f"exit status {done.returncode}"))


def _persist(client, arrays: dict) -> dict:
    from distributed import wait

    persisted = {k: client.persist(v) for k, v in arrays.items()}
    wait([f for v in persisted.values() for f in _futures(v)])
    return persisted


def _futures(collection):
    from distributed import futures_of

    return futures_of(collection)


def _measured(cluster, collections: tuple) -> tuple[Any, float, int, dict]:
    """Compute on the cluster: (values, wall seconds, bytes spilled device -> host and
    host -> disk meanwhile, bytes per move between tiers summed over workers)."""
    from spillway.launch.plugins import worker_snapshot
    from spillway.run.stats import transfer_stats
    from ..measure import spill_moves

    client = cluster.client
    before = client.run(worker_snapshot)
    start_wall = time.time()
    t0 = time.perf_counter()
    values = cluster.compute(*collections, progress=False)
    wall = time.perf_counter() - t0
    after = client.run(worker_snapshot)
    spilled = transfer_stats(before, after, start_wall=start_wall)["bytes_spilled"]
    return values, wall, spilled, bounds.move_bytes(spill_moves(before, after)["moves"])


def _admit(cluster, name: str, footprint) -> None:
    from spillway.memory.admission import admit, cluster_capacity

    admit(name, footprint, cluster_capacity(cluster.client))


def run_notebook(case: Case, scale: Scale, cluster, *, seed: int = SEED) -> dict:
    """On ``cluster`` (a :func:`spillway.local` cluster): generate the workflow's inputs from
    the seed, persist them as a user would, hand them to the workflow, compute its graph
    through the notebook's ``compute`` and check against the seeded reference."""
    from spillway import workflows
    from spillway.options.errors import AdmissionError
    from spillway.run.target import target_of
    from spillway.workflows import random
    from spillway.workflows.backend import chunk_backend_for
    from spillway.workflows.workflow import relative_error

    workflow = workflows.get(case.workflow)
    target = target_of(cluster.session)
    params, _ = workflow_params(case, scale, seed, target)
    _, seeded = workflow.build_run(params, target)
    backend = chunk_backend_for(cluster.kind)
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
        _, built = workflow.build_run(params, target, arrays=persisted)
        # a built run's result is one collection or a tuple of them; compute returns the same shape
        collections = built.result if isinstance(built.result, tuple) else (built.result,)
        value, wall, spilled, moves = _measured(cluster, collections)
        expected, how = seeded.reference(value)
        err = float(relative_error(built.checked(value), expected))
        return row(case, scale, params=params, footprint_bytes=built.footprint.total_bytes,
                   ok=err <= built.tolerance, rel_error=err, tolerance=built.tolerance, wall_s=wall,
                   spilled_bytes=spilled, moves=moves, reference=how, inputs={k: list(v[0]) for k, v in wanted.items()},
                   error=None if err <= built.tolerance else f"relative error {err:.3e} above {built.tolerance:.0e}")
    except Exception as e:  # a failed case is a row of the table, not the end of the matrix
        return row(case, scale, params=params, footprint_bytes=seeded.footprint.total_bytes,
                   error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    finally:
        del persisted


def run_user_code(case: Case, scale: Scale, cluster, *, seed: int = SEED) -> dict:
    """User-written dask code on inputs the user persisted first, on ``cluster``."""
    from spillway.options.errors import AdmissionError
    from spillway.workflows.backend import chunk_backend_for

    nbytes = user_size(case, scale, seed)
    built = USER_CODE[case.workflow](nbytes, scale, seed, chunk_backend_for(cluster.kind))
    fp = built.footprint.total_bytes
    try:
        _admit(cluster, case.workflow, built.footprint)
    except AdmissionError as e:
        return row(case, scale, footprint_bytes=fp, refused=True, error=str(e))
    persisted = _persist(cluster.client, built.inputs)
    try:
        values, wall, spilled, moves = _measured(cluster, built.results(persisted))
        values = values if isinstance(values, tuple) else (values,)
        err = built.check(values)
        ok = err <= built.tolerance
        return row(case, scale, footprint_bytes=fp, ok=ok, rel_error=err, tolerance=built.tolerance, wall_s=wall,
                   spilled_bytes=spilled, moves=moves, reference=built.reference,
                   inputs={k: list(v.shape) for k, v in built.inputs.items()},
                   error=None if ok else f"relative error {err:.3e} above {built.tolerance:.0e}")
    except Exception as e:
        return row(case, scale, footprint_bytes=fp,
                   error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    finally:
        del persisted


def run_case(case: Case, scale: Scale, *, cluster=None, ceilings: dict | None = None, **kwargs) -> dict:
    """One case on its path (``cluster`` for the notebook and user-code paths). With
    ``ceilings`` (GB/s by name, measured in the same run: :func:`bounds.copy_ceilings`) the
    row gets its copy bound next to its time."""
    if case.path == "cli":
        out = run_cli(case, scale, **kwargs)
    elif case.path in ("service", "batch"):
        from .entry import run_batch, run_service

        out = (run_service if case.path == "service" else run_batch)(case, scale, **kwargs)
    elif cluster is None:
        raise ValueError(f"{case.id}: the {case.path} path runs on a spillway.local() cluster")
    else:
        runner = run_notebook if case.path == "notebook" else run_user_code
        out = runner(case, scale, cluster, **kwargs)
    return with_bound(out, ceilings, scale.n_workers)


def with_bound(r: dict, ceilings: dict | None, n_workers: int) -> dict:
    """``r`` with ``ceilings`` and ``copy_bound`` (bound, time and their ratio) where it has
    moves and the ceilings are known."""
    if ceilings is None or r.get("moves") is None:
        return {**r, "ceilings": ceilings, "copy_bound": None}
    bound = bounds.copy_bound(r["moves"], ceilings, n_workers)
    return {**r, "ceilings": ceilings, "copy_bound": bounds.with_time(bound, r.get("wall_s"))}
