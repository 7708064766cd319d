"""Run each workload on its sides' clusters (:mod:`.clusters`, :mod:`.sides`) and measure
them (:mod:`.measure`): one warm-up and ``runs`` timed runs on fresh inputs each, the
workers emptied between runs. Workloads with the same cluster settings share a cluster per
side; a ``fresh_cluster`` workload (O3-O5) gets one per side, its first run recorded as
``first_s`` in place of the warm-up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask.config

from spillway.options.errors import ParamError
from spillway.options.gpus import Inventory
from spillway.launch import LaunchPlan
from spillway.options.settings import Options

from .clusters import baseline_cluster, spillway_cluster, wait_for_gpus
from .measure import SideResult, timed_run_recorded, wait_released
from .sides import SIDES
from .workloads import Workload
from .workloads.expressions import rechunk_method

#: seeds of the warm-up and timed runs: run i uses SEED_BASE + i
SEED_BASE = 1000

#: entries each worker keeps in its incoming-transfer log (distributed keeps 1000)
TRANSFER_LOG_LENGTH = 200_000

#: why the baseline of a workload did not run when the command said so
NO_BASELINE = "skipped: --no-baseline"


# --- the whole benchmark


@dataclass
class BenchRun:
    """What one ``spillway bench`` run does, fixed before anything starts."""

    options: Options
    launch: LaunchPlan
    inventory: Inventory | None
    workloads: list[Workload]
    scale: str
    runs: int
    timeout: float
    #: an earlier results file on this machine to add these workloads to, and its path
    merge_into: dict | None = None
    merge_path: Any = None
    #: run the baseline cluster too (``--no-baseline`` measures spillway's side alone)
    baseline: bool = True
    #: a short name of this run, kept in the JSON and the file names
    label: str | None = None
    #: record each workload's slowest timed run per worker (``--timeline``)
    timeline: bool = False
    #: the side whose cluster starts first (``--first-side``): on a freshly started host
    #: it alone meets the host's first touch of its memory
    first_side: str = "spillway"
    #: the results file or directory to compare with (:mod:`.previous`); None: where the
    #: results are written
    previous: Any = None


def check_fits(workloads: list[Workload], scale: str, kind: str, budget_bytes: int) -> None:
    """Refuse, before any memory is taken, a workload whose inputs cannot fit."""
    for w in workloads:
        need = w.input_bytes(scale)
        if need > budget_bytes:
            from spillway.options.sizes import format_bytes

            raise ParamError(
                f"sizes: {w.name} at {scale} needs {format_bytes(need)} of input, more than the "
                f"{format_bytes(budget_bytes)} the {kind} workers can hold; use --sizes tiny or small"
            )


def worker_bytes(bench_run: BenchRun) -> int:
    """Memory one worker holds before it spills: 80% of the smallest GPU (dask-cuda's
    default limit), or an even share of the host's memory."""
    import psutil

    if bench_run.launch.kind == "gpu" and bench_run.launch.device_memory:
        return int(0.8 * min(bench_run.launch.device_memory))
    return psutil.virtual_memory().total // max(1, bench_run.launch.n_workers)


def groups(bench_run: BenchRun) -> list[tuple[dict[str, dict], list[Workload]]]:
    """Workloads that share cluster settings, in order, with each of their sides' options
    changes (``{"spillway": ..., "baseline": ...}``); B2's device limit and B3's tiers are
    their own, and a ``fresh_cluster`` workload (O3, O4) is always alone."""
    out: list[tuple[dict[str, dict], list[Workload]]] = []
    alone = False
    for w in bench_run.workloads:
        changes = {side: w.cluster_changes(bench_run.scale, bench_run.launch.kind, side) for side in w.sides}
        if out and out[-1][0] == changes and not alone and not w.fresh_cluster:
            out[-1][1].append(w)
        else:
            out.append((changes, [w]))
        alone = w.fresh_cluster
    return out


def run(bench_run: BenchRun, *, log: Callable[[str], None],
        spillway: Callable = spillway_cluster, baseline: Callable = baseline_cluster) -> dict:
    """Both sides of every workload; returns per-workload results and cluster descriptions."""
    from spillway.workflows.params import Target

    kind = bench_run.launch.kind
    # the same target on both sides, so both build the same graph from the same inputs
    target = Target(kind=kind, n_workers=bench_run.launch.n_workers, worker_bytes=worker_bytes(bench_run))
    results: dict[str, dict[str, SideResult]] = {w.name: {} for w in bench_run.workloads}
    clusters: dict[str, dict] = {}
    with dask.config.set({"distributed.admin.low-level-log-length": TRANSFER_LOG_LENGTH}):
        for changes, members in groups(bench_run):
            for side in sorted(changes, key=lambda s: s != bench_run.first_side):
                mine = changes[side]
                if SIDES[side].cluster == "spillway":
                    opener = lambda: spillway(  # noqa: E731
                        bench_run.options.replace(**mine) if mine else bench_run.options, bench_run.inventory)
                else:
                    opener = lambda: baseline(bench_run.launch, bench_run.options, mine)  # noqa: E731
                running = []
                for w in members:
                    skip = None
                    if side == "baseline":
                        skip = w.baseline_skip or (None if bench_run.baseline else NO_BASELINE)
                    if skip:
                        results[w.name][side] = SideResult(skipped=skip)
                        log(f"{w.name} {side:<8} {skip}")
                    else:
                        running.append(w)
                if running:
                    _run_side(opener, running, side, bench_run, target, kind, results, clusters, log)
                for w in running if mine else ():
                    results[w.name][side].notes.append(
                        "cluster options of this workload: " + ", ".join(f"{k}={v}" for k, v in mine.items()))
    return {"results": results, "clusters": clusters}


def _run_side(opener, members, side, bench_run, target, kind, results, clusters, log):
    """Run ``members`` on one side; a failed workload gets a fresh cluster for the next."""
    pending = list(members)
    while pending:
        if kind == "gpu" and bench_run.inventory is not None:
            wait_for_gpus(bench_run.inventory, bench_run.launch.devices, log)
        log(f"starting the {side} cluster")
        try:
            with opener() as (client, described):
                clusters.setdefault(side, described)
                while pending:
                    w = pending.pop(0)
                    try:
                        results[w.name][side] = run_workload(
                            client, w, scale=bench_run.scale, target=target, runs=bench_run.runs,
                            timeout=bench_run.timeout, kind=kind, log=log, label=side, timeline=bench_run.timeline)
                    except Exception as e:  # one workload failing must not end the benchmark
                        error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                        expected = w.baseline_expected_failure if side == "baseline" else None
                        results[w.name][side] = SideResult(error=error, expected_failure=expected)
                        log(f"{w.name} {side:<8} FAILED: {error}" + (f" (expected: {expected})" if expected else ""))
                        # the traceback goes to the log file only
                        logging.getLogger("spillway_bench.progress").info(
                            "%s on %s failed", w.name, side, exc_info=True)
                        break  # restart the cluster: the failure may have left it unusable
        except Exception as e:
            error = f"{side} cluster failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log(error)
            for w in pending:
                results[w.name][side] = SideResult(error=error)
            return


# --- one workload on one side


def run_workload(client, workload: Workload, *, scale: str, target, runs: int, timeout: float,
                 kind: str, log: Callable[[str], None], label: str, timeline: bool = False) -> SideResult:
    """One warm-up (where the workload has one) and ``runs`` timed runs of ``workload``,
    each on fresh inputs; the last is checked against the workload's reference. With
    ``timeline`` every timed run's timeline is recorded (:func:`timed_run_recorded`) and
    the slowest one's kept. A ``fresh_cluster`` workload's warm-up is its first run on
    the side's own new cluster, recorded as ``first_s`` (:meth:`SideResult.record_first`)."""
    result = SideResult()
    if not workload.warmup:
        result.notes.append("no warm-up run (its inputs alone take minutes to persist)")
    if workload.fresh_cluster:
        result.notes.append("a cluster of its own; its first run (no warm-up before it) is first_s")
    capped = workload.timed_runs(scale, runs)
    if capped < runs:
        runs = capped
        result.notes.append(f"{runs} timed run at {scale} size (one run takes minutes)")
    for i in range(0 if workload.warmup else 1, runs + 1):
        seed = SEED_BASE + i
        settings = SIDES[label].build_config(dask.config.config) if workload.user_code and label in SIDES else {}
        # the side's own client is the default while its graph is built: a user's code
        # persists its field there (:func:`.workloads.expressions.held`), not on another
        # side's cluster
        with dask.config.set(settings), client.as_current():
            built = workload.build(scale, target, seed, side=label)
        result.source = built.source
        if workload.user_code:
            result.rechunk_method = rechunk_method(built.result)
        if built.note and built.note not in result.notes:
            result.notes.append(built.note)
        check = workload.reference is not None and i == runs
        measure, recorded = timed_run_recorded(client, built.result, kind=kind, timeout=timeout,
                                               keep_value=check, check=workload.check, record=timeline and i >= 1)
        # the slowest timed run's: where a stall shows, it is the one to explain
        if recorded is not None and measure.seconds >= max(result.runs_s, default=0.0):
            result.timeline = recorded
        del built
        if not wait_released(client):
            result.notes.append("workers still held data 120 s after a run")
        what = ("first run" if workload.fresh_cluster else "warm-up") if i == 0 else f"run {i}/{runs}"
        log(f"{workload.name} {label:<8} {what:<9} {measure.seconds:9.3f} s  "
            f"moved {measure.bytes_moved / 1e9:8.2f} GB  spilled {measure.bytes_spilled / 1e9:7.2f} GB  "
            f"(inputs persisted in {measure.persist_s:.2f} s; waited {_seconds(measure.waited_s)}, "
            f"device sync {_seconds(measure.synchronized_s)}"
            + (f"; arena pinning {measure.arena_pin_s:.2f} s" if measure.arena_pin_s else "") + ")"
            + _forced_line(measure))
        if i == 0:
            result.warmup_s = measure.seconds
            if workload.fresh_cluster:
                result.record_first(measure)
            continue
        result.runs_s.append(measure.seconds)
        result.arena_pin_s.append(measure.arena_pin_s)
        result.transfers.extend(measure.transfers)
        result.bytes_moved.append(measure.bytes_moved)
        result.bytes_spilled.append(measure.bytes_spilled)
        result.persist_s.append(measure.persist_s)
        if measure.tasks is not None:
            result.tasks.append(measure.tasks)
        result.spill.append(measure.spill)
        result.forced.append(measure.forced)
        result.persist_spill.append(measure.persist_spill)
        result.resident = measure.resident
        if check:
            result.verify = verify(workload, scale, seed, measure.value, log=log, label=label)
            if not result.verify["ok"]:
                result.error = (f"result check failed: relative error {result.verify['rel_error']:.3e} "
                                f"above {workload.tolerance:.0e}")
    plane = plane_phases(client)
    if plane:
        log(f"{workload.name} {label:<8} data plane: {plane}")
    for kind in ("collective", "step"):
        exchange = exchange_phases(client, kind)
        if exchange:
            log(f"{workload.name} {label:<8} {kind}: {exchange}")
    return result


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def exchange_phases(client, kind: str) -> str | None:
    """The exchange's phases on each worker, ``kind`` ``collective`` (the pieces' tasks) or
    ``step`` (ms summed over every run of the workload so far, counts, and the median of
    one in ms: :func:`spillway.run.measuring.collective_phases` and ``step_phases``), None
    where no worker ran one."""
    from spillway.run import measuring

    found = [p for p in client.run(getattr(measuring, f"{kind}_phases")).values() if p]
    if not found:
        return None
    parts = []
    for p in found:
        median = p.get("median", {})
        parts.append(" ".join(f"{name} {p['seconds'][name] * 1e3:.0f} ms/{p['counts'][name]}"
                              f" (median {median.get(name, 0) * 1e3:.2f})"
                              for name in sorted(p["seconds"])) + f" taken {p['taken_bytes'] / 1e9:.1f} GB"
                     + "".join(f", {n} round(s) over {kind}" for kind, n in p.get("transports", {}).items()))
    return " | ".join(parts)


def plane_phases(client) -> str | None:
    """The data plane's phases on the workers (median and max ms of the latest fetches and serves:
    :func:`spillway.run.measuring.plane_counters`), None where no worker has a plane."""
    from spillway.run.measuring import plane_counters

    counters = [c for c in client.run(plane_counters).values() if c]
    if not counters:
        return None
    fetched = sum(c["fetched"] for c in counters)
    parts = []
    for c in counters:
        phases = c.get("phases") or {}
        parts.append(" ".join(f"{name} {v['median_s'] * 1e3:.2f}/{v.get('max_s', 0) * 1e3:.1f}"
                              for name, v in phases.items()))
    return f"{fetched} fetches; median/max ms per worker: " + " | ".join(parts)


#: references already computed in this process, by (workload, scale, seed)
_REFERENCES: dict[tuple, Any] = {}


def verify(workload: Workload, scale: str, seed: int, value, *, log, label: str) -> dict:
    """``value`` (one run's result) against the workload's NumPy float64 reference: a
    scalar, or where the workload has a ``check``, each of its parts (the largest
    relative error counts; the JSON keeps each part's norm, not the arrays)."""
    import numpy as np

    from spillway.workflows.backend import to_numpy
    from spillway.workflows.workflow import relative_error

    parts = isinstance(value, tuple)
    if parts:
        computed = tuple(np.asarray(to_numpy(v)) for v in value)
        shown = "norms " + ", ".join(f"{np.linalg.norm(c.ravel()):.17g}" for c in computed)
    else:
        computed = float(value.get() if hasattr(value, "get") else value)  # a CuPy scalar comes back as 0-d
        shown = repr(computed)
    # logged before the reference, which takes minutes at full sizes
    log(f"{workload.name} {label:<8} result    {shown} (seed {seed}); computing the NumPy reference")
    t0 = time.perf_counter()
    key = (workload.name, scale, seed)
    if key not in _REFERENCES:  # every side checks the same seed: B4's, B5's, O3's and O4's take a minute at full size
        _REFERENCES[key] = workload.reference(workload.params(scale), seed)
    expected = _REFERENCES[key]
    reference_s = time.perf_counter() - t0
    if parts:
        errors = [float(relative_error(c, r)) for c, r in zip(computed, expected, strict=True)]
        err = max(errors)
        computed_json = [float(np.linalg.norm(c.ravel())) for c in computed]
        expected_json = [float(np.linalg.norm(np.asarray(r).ravel())) for r in expected]
        expected_shown = "norms " + ", ".join(f"{v:.17g}" for v in expected_json)
    else:
        err = float(relative_error(np.float64(computed), np.float64(expected)))
        errors, computed_json, expected_json, expected_shown = None, computed, expected, repr(expected)
    ok = bool(err <= workload.tolerance)
    log(f"{workload.name} {label:<8} check     {'OK' if ok else 'FAILED'}: {shown} against "
        f"{expected_shown}, relative error {err:.3e} (reference in {reference_s:.1f} s)")
    out = {"seed": seed, "value": computed_json, "reference": expected_json, "rel_error": err,
           "tolerance": workload.tolerance, "ok": ok, "reference_s": reference_s,
           "how": "NumPy float64 on the host CPUs, from the seed"}
    if parts:
        out["rel_errors"] = errors
        out["how"] += "; each part of the workload's check (value and reference: their norms)"
    return out


def _forced_line(measure) -> str:
    """The run's moves beside the bytes its capacities force (``D->H 160.7/113.0 GB``),
    where its workers keep a peak."""
    forced = measure.forced
    if not forced or not measure.spill:
        return ""
    from .bounds import SHORT

    parts = [f"{SHORT[m]} {measure.spill['moves'][m]['bytes'] / 1e9:.1f}/{f / 1e9:.1f}"
             for m, f in forced["moves"].items() if f or measure.spill["moves"][m]["bytes"]]
    spill = measure.spill
    d2h = spill["moves"]["device_to_host"]
    line = f"\n    moved/forced GB: {', '.join(parts) or 'none'}; peak held {forced['peak_bytes'] / 1e9:.1f} GB"
    if d2h["bytes"] and d2h["seconds"]:
        host = spill.get("host_buffers") or {}
        taken = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in (host.get("taken_from") or {}).items() if v)
        line += (f"\n    D->H {d2h['bytes'] / d2h['seconds'] / 1e9:.1f} GB/s over {d2h['seconds']:.2f} s, of which "
                 f"{spill.get('spill_alloc_s') or 0:.2f} s getting buffers (room {host.get('room_s', 0):.2f} s, "
                 f"new {host.get('new_s', 0):.2f} s); host buffers GB: {taken or 'none'}"
                 + (f"; touched ahead {host['touched_ahead'] / 1e9:.1f} GB in {host.get('ahead_s', 0):.2f} s"
                    if host.get("touched_ahead") else ""))
    written = spill.get("written_below") or {}
    if any(written.values()):
        line += (f"\n    to disk GB: drain {written['drained'] / 1e9:.1f}, the machine's room "
                 f"{written['room_written'] / 1e9:.1f}, the host limit {written['limit_written'] / 1e9:.1f}; "
                 f"a task here still waited for {written['needed_written'] / 1e9:.1f}")
    return line
