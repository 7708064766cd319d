"""Run each workload on spillway's cluster and on the plain baseline, and measure both.

For every workload and side: one warm-up and ``runs`` timed runs, each on fresh inputs (a
new seed, so new keys). Before the clock starts the run's random inputs are persisted;
the clock covers submitting the rest of the graph until every output chunk is in worker
memory (and, on GPUs, the devices are synchronised). Then the outputs and inputs are
released and the harness waits until the workers hold nothing, so one run's memory never
slows the next. Worker-to-worker bandwidth and bytes moved come from the workers'
incoming-transfer logs, bytes spilled from spillway's spill counters (registered on the
baseline's workers too; they only count, they change no setting). Spill throughput (bytes
and seconds of each move between device, host and disk, and the time tasks waited for
restores) comes from spillway's tiered store, which times its copies; the baseline's
spills are counted but not timed.

The baseline is what a user gets without spillway: ``LocalCUDACluster(protocol="ucx")``
at dask-cuda's defaults on the same GPUs, or ``distributed.LocalCluster`` with the same
number of workers on CPU. Only the dashboard is off on both sides, and the transfer log
is made long enough to hold a whole run. A plan without the baseline (``--no-baseline``)
records each workload's baseline as skipped and starts no baseline cluster.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import dask.config

from spillway.service.errors import ParamError
from spillway.service.gpus import Inventory
from spillway.service.launch import LaunchPlan, open_cluster
from spillway.service.launch.plan import ucxx_installed
from spillway.service.options import Options
from spillway.service.memory.store import MOVES
from spillway.service.plugins import WorkerSetup, worker_snapshot
from spillway.service.transfer import transport
from .workloads import Workload

#: spillway's settings for speed, used where the user set no value of their own: an RMM
#: pool so buffers (and the CUDA IPC handles UCX caches for them) are reused instead of
#: allocated per chunk, and no dashboard
BENCH_OPTIONS = {"rmm_pool_size": 0.85, "dashboard_address": None}

#: seeds of the warm-up and timed runs: run i uses SEED_BASE + i
SEED_BASE = 1000

#: transfers smaller than this are left out of bandwidth percentiles (headers, scalars)
MIN_TRANSFER_BYTES = 1_000_000
#: the chunk size from which the issue's 80%-of-peer-copy target applies
LARGE_TRANSFER_BYTES = 256 * 2**20

#: entries each worker keeps in its incoming-transfer log (distributed keeps 1000)
TRANSFER_LOG_LENGTH = 200_000

#: why the baseline of a workload did not run when the command said so
NO_BASELINE = "skipped: --no-baseline"

#: the worker settings that shape transfers, read on a worker of each side
TRANSFER_KEYS = ("distributed.worker.connections.incoming", "distributed.worker.connections.outgoing",
                 "distributed.worker.transfer.message-bytes-limit")


def bench_options(options: Options, kind: str) -> Options:
    """``options`` with :data:`BENCH_OPTIONS` where no source but the defaults set a value
    (the RMM pool only for GPU workers, and only where no other allocator was chosen)."""
    changes = {}
    for key, value in BENCH_OPTIONS.items():
        if options.sources.get(key, "default") != "default":
            continue
        if key == "rmm_pool_size" and (kind != "gpu" or options.rmm_async or options.rmm_managed_memory):
            continue
        changes[key] = value
    return options.replace(**changes) if changes else options


class SpillCounter(WorkerSetup):
    """spillway's worker plugin without its allocator changes: on the baseline it only
    records the worker's kind and counts spilled bytes, leaving dask-cuda's memory
    setup as it is."""

    def _setup_gpu(self, store=None):
        pass


def synchronize_device(dask_worker=None) -> None:
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


def _held(dask_worker=None) -> int:
    return len(dask_worker.data)


def _scheduler_tasks(dask_scheduler=None) -> int:
    return len(dask_scheduler.tasks)


def _worker_transfer(dask_worker=None) -> dict:
    return {key: dask.config.get(key) for key in TRANSFER_KEYS}


def _worker_ucx(dask_worker=None) -> dict:
    """The UCX transports a worker was configured with: environment and dask config."""
    import os

    env = {k: v for k, v in os.environ.items() if k.startswith("UCX_")}
    return {"env": env, "config": dask.config.get("distributed.comm.ucx", default={})}


@dataclass
class RunMeasure:
    seconds: float
    transfers: list[tuple[int, float]]  # (bytes, seconds) of each incoming transfer
    bytes_moved: int
    bytes_spilled: int
    #: seconds to persist the inputs (before the clock)
    persist_s: float = 0.0
    #: :func:`spill_moves` of the timed part, and of persisting the inputs
    spill: dict | None = None
    persist_spill: dict | None = None
    #: bytes the workers' tiered stores held per tier once the inputs were persisted
    resident: dict | None = None
    #: the gathered result, where asked for
    value: Any = None
    #: the clock's start and stop as wall-clock times (``time.time()``)
    window: tuple[float, float] | None = None


def spill_moves(before: dict, after: dict) -> dict:
    """Bytes and seconds of each move between tiers, summed over the workers, between two
    :func:`~spillway.service.plugins.worker_snapshot` sets, and the time tasks waited on restores.
    Seconds and waits are None where no worker has spillway's tiered store (it alone
    times its copies; other stores' moves are only counted)."""
    moves = {m: {"bytes": 0, "seconds": 0.0} for m in MOVES}
    timed, wait, producer = False, 0.0, 0.0
    for addr, snap in after.items():
        old = before.get(addr, {})
        if snap.get("store"):
            timed = True
            new_stats = snap["store"]["stats"]
            old_stats = (old.get("store") or {}).get("stats") or {}
            for m in MOVES:
                moves[m]["bytes"] += new_stats["bytes"].get(m, 0) - old_stats.get("bytes", {}).get(m, 0)
                moves[m]["seconds"] += new_stats["seconds"].get(m, 0.0) - old_stats.get("seconds", {}).get(m, 0.0)
            wait += new_stats.get("wait_s", 0.0) - old_stats.get("wait_s", 0.0)
            producer += new_stats.get("producer_wait_s", 0.0) - old_stats.get("producer_wait_s", 0.0)
        else:
            for m in MOVES:
                moves[m]["bytes"] += snap["spilled"].get(m, 0) - old.get("spilled", {}).get(m, 0)
    if not timed:
        for v in moves.values():
            v["seconds"] = None
    return {"moves": moves, "restore_wait_s": wait if timed else None,
            "spill_producer_wait_s": producer if timed else None, "workers": len(after)}


def _median_of(runs: list[dict], key: str) -> float | None:
    """The median of ``key`` over the runs that timed it; None where none did."""
    values = [r[key] for r in runs if r and r.get(key) is not None]
    return statistics.median(values) if values else None


def resident_bytes(snapshots: dict) -> dict | None:
    """Bytes per tier held by the workers' tiered stores, summed; None without one."""
    stores = [snap["store"] for snap in snapshots.values() if snap.get("store")]
    if not stores:
        return None
    return {tier: sum(st[f"{tier}_bytes"] for st in stores) for tier in ("device", "host", "disk")}


def summarize_spills(runs: list[dict]) -> dict | None:
    """Per move over the timed runs: the median bytes and seconds of one run, and GB/s
    per worker (bytes over the seconds the workers spent copying, all runs together)."""
    runs = [r for r in runs if r]
    if not runs:
        return None
    out = {}
    for m in MOVES:
        nbytes = [r["moves"][m]["bytes"] for r in runs]
        secs = [r["moves"][m]["seconds"] for r in runs]
        timed = all(x is not None for x in secs)
        total_s = sum(secs) if timed else None
        out[m] = {
            "bytes": int(statistics.median(nbytes)),
            "seconds": statistics.median(secs) if timed else None,
            "gbps_per_worker": sum(nbytes) / total_s / 1e9 if timed and total_s > 0 else None,
        }
    return out


@dataclass
class SideResult:
    """One workload on one side (spillway or baseline)."""

    source: str = ""
    notes: list[str] = field(default_factory=list)
    warmup_s: float | None = None
    runs_s: list[float] = field(default_factory=list)
    transfers: list[tuple[int, float]] = field(default_factory=list)
    bytes_moved: list[int] = field(default_factory=list)
    bytes_spilled: list[int] = field(default_factory=list)
    persist_s: list[float] = field(default_factory=list)
    spill: list[dict] = field(default_factory=list)
    persist_spill: list[dict] = field(default_factory=list)
    resident: dict | None = None
    #: the last timed run's result against the workload's reference
    verify: dict | None = None
    error: str | None = None
    #: why this side did not run, where it did not
    skipped: str | None = None
    #: the known failure this side's ``error`` is (B5's baseline): recorded, not a failed bench
    expected_failure: str | None = None
    #: where the first timed run's time went per worker (``--timeline``)
    timeline: dict | None = None

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.runs_s) if self.runs_s and self.error is None else None

    def bandwidth(self, min_bytes: int = MIN_TRANSFER_BYTES) -> dict[str, float | None]:
        """p25, median and p75 of per-transfer bandwidth in GB/s."""
        values = sorted(b / s / 1e9 for b, s in self.transfers if b >= min_bytes and s > 0)
        if not values:
            return {"p25": None, "median": None, "p75": None, "count": 0}
        if len(values) == 1:
            q = (values[0],) * 3
        else:
            q = statistics.quantiles(values, n=4, method="inclusive")
        return {"p25": q[0], "median": statistics.median(values), "p75": q[2], "count": len(values)}

    def to_json(self) -> dict:
        bw = self.bandwidth()
        large = self.bandwidth(LARGE_TRANSFER_BYTES)
        return {
            "source": self.source,
            "notes": self.notes,
            "error": self.error,
            "median_s": self.median_s,
            "runs_s": self.runs_s,
            "warmup_s": self.warmup_s,
            "transfer_gbps_p25": bw["p25"],
            "transfer_gbps_median": bw["median"],
            "transfer_gbps_p75": bw["p75"],
            "transfers_counted": bw["count"],
            "transfer_gbps_median_256mib": large["median"],
            "bytes_moved": int(statistics.median(self.bytes_moved)) if self.bytes_moved else None,
            "bytes_spilled": int(statistics.median(self.bytes_spilled)) if self.bytes_spilled else None,
            "skipped": self.skipped,
            "expected_failure": self.expected_failure if self.error else None,
            "persist_s": statistics.median(self.persist_s) if self.persist_s else None,
            "resident_after_persist": self.resident,
            "spill_moves": summarize_spills(self.spill),
            "spill_timed": _median_of(self.spill, "restore_wait_s") is not None,
            "restore_wait_s": _median_of(self.spill, "restore_wait_s"),
            "spill_producer_wait_s": _median_of(self.spill, "spill_producer_wait_s"),
            "persist_spill_moves": summarize_spills(self.persist_spill),
            "verify": self.verify,
            "timeline": self.timeline,
        }


# --- the inputs: persisted before the clock starts


def split_inputs(client, collection, timeout: float):
    """Persist the root layers of ``collection`` (its generated inputs) and return
    ``(futures, collection over them)``. The keys stay the same, so nothing is
    recomputed, and graph optimisation cannot fuse input generation into the timed part.
    """
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
    from distributed import wait

    graph = collection.__dask_graph__()
    if not isinstance(graph, HighLevelGraph):
        raise TypeError(f"expected a layered dask graph, got {type(graph).__name__}")
    roots = [name for name, deps in graph.dependencies.items() if not deps]
    keys = [k for name in roots for k in graph.layers[name]]
    tasks = {k: graph.layers[name][k] for name in roots for k in graph.layers[name]}
    futures = client.get(tasks, keys, sync=False)
    wait(futures, timeout=timeout)
    by_key = dict(zip(keys, futures))
    layers = dict(graph.layers)
    for name in roots:
        layers[name] = MaterializedLayer({k: by_key[k] for k in graph.layers[name]})
    rebuild, args = collection.__dask_postpersist__()
    return futures, rebuild(HighLevelGraph(layers, graph.dependencies), *args)


def wait_released(client, timeout: float = 120) -> bool:
    """Wait until the scheduler knows no task and no worker holds data."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.run_on_scheduler(_scheduler_tasks) == 0 and not any(client.run(_held).values()):
            return True
        time.sleep(0.05)
    return False


def timed_run(client, collection, *, kind: str, timeout: float, keep_value: bool = False) -> RunMeasure:
    from distributed import futures_of, wait

    start_persist = client.run(worker_snapshot)
    t0 = time.perf_counter()
    inputs, op = split_inputs(client, collection, timeout)
    persist_s = time.perf_counter() - t0
    before = client.run(worker_snapshot)
    window_start = time.time()
    start = time.perf_counter()
    persisted = client.persist(op)
    futures = futures_of(persisted)
    wait(futures, timeout=timeout)
    if kind == "gpu":
        client.run(synchronize_device)
    seconds = time.perf_counter() - start
    window = (window_start, time.time())
    failed = [f for f in futures if f.status != "finished"]
    if failed:
        failed[0].result()  # raises the task's exception
    after = client.run(worker_snapshot)
    value = client.gather(futures[0]) if keep_value else None
    del persisted, futures, inputs, op

    transfers, moved = [], 0
    for snap in after.values():
        for t in snap["transfers"]:
            if t["start"] >= window_start - 1e-3:
                moved += t["bytes"]
                transfers.append((t["bytes"], max(1e-9, t["stop"] - t["start"])))
    spilled = 0
    for addr, snap in after.items():
        old = before.get(addr, {}).get("spilled", {})
        for tier in ("device_to_host", "host_to_disk"):
            spilled += snap["spilled"].get(tier, 0) - old.get(tier, 0)
    return RunMeasure(seconds=seconds, transfers=transfers, bytes_moved=moved, bytes_spilled=spilled,
                      persist_s=persist_s, spill=spill_moves(before, after),
                      persist_spill=spill_moves(start_persist, before), resident=resident_bytes(before),
                      value=value, window=window)


def run_workload(client, workload: Workload, *, scale: str, target, runs: int, timeout: float,
                 kind: str, log: Callable[[str], None], label: str, timeline: bool = False) -> SideResult:
    """One warm-up (where the workload has one) and ``runs`` timed runs of ``workload``,
    each on fresh inputs; the last is checked against the workload's reference. With
    ``timeline`` the first timed run's timeline is recorded (:func:`timed_run_recorded`)."""
    result = SideResult()
    if not workload.warmup:
        result.notes.append("no warm-up run (its inputs alone take minutes to persist)")
    capped = workload.timed_runs(scale, runs)
    if capped < runs:
        runs = capped
        result.notes.append(f"{runs} timed run at {scale} size (one run takes minutes)")
    for i in range(0 if workload.warmup else 1, runs + 1):
        seed = SEED_BASE + i
        built = workload.build(scale, target, seed, side=label)
        result.source = built.source
        if built.note and built.note not in result.notes:
            result.notes.append(built.note)
        check = workload.reference is not None and i == runs
        measure, recorded = timed_run_recorded(client, built.result, kind=kind, timeout=timeout,
                                               keep_value=check, record=timeline and i == 1)
        if recorded is not None:
            result.timeline = recorded
        del built
        if not wait_released(client):
            result.notes.append("workers still held data 120 s after a run")
        what = "warm-up" if i == 0 else f"run {i}/{runs}"
        log(f"{workload.name} {label:<8} {what:<9} {measure.seconds:9.3f} s  "
            f"moved {measure.bytes_moved / 1e9:8.2f} GB  spilled {measure.bytes_spilled / 1e9:7.2f} GB  "
            f"(inputs persisted in {measure.persist_s:.2f} s)")
        if i == 0:
            result.warmup_s = measure.seconds
            continue
        result.runs_s.append(measure.seconds)
        result.transfers.extend(measure.transfers)
        result.bytes_moved.append(measure.bytes_moved)
        result.bytes_spilled.append(measure.bytes_spilled)
        result.persist_s.append(measure.persist_s)
        result.spill.append(measure.spill)
        result.persist_spill.append(measure.persist_spill)
        result.resident = measure.resident
        if check:
            result.verify = verify(workload, scale, seed, measure.value, log=log, label=label)
            if not result.verify["ok"]:
                result.error = (f"result check failed: relative error {result.verify['rel_error']:.3e} "
                                f"above {workload.tolerance:.0e}")
    return result


def timed_run_recorded(client, collection, *, record: bool, **kwargs) -> tuple[RunMeasure, dict | None]:
    """:func:`timed_run`, and where ``record`` is set, where its time went on each worker
    (:mod:`spillway.bench.timeline`; read after the clock stops)."""
    if not record:
        return timed_run(client, collection, **kwargs), None
    from . import timeline

    with timeline.recording(client) as rec:
        measure = timed_run(client, collection, **kwargs)
    return measure, rec.result(measure.window)


#: references already computed in this process, by (workload, scale, seed)
_REFERENCES: dict[tuple, Any] = {}


def verify(workload: Workload, scale: str, seed: int, value, *, log, label: str) -> dict:
    """``value`` (one run's result) against the workload's NumPy float64 reference."""
    import numpy as np

    from spillway.workflows.registry import relative_error

    computed = float(value.get() if hasattr(value, "get") else value)  # a CuPy scalar comes back as 0-d
    # logged before the reference, which takes minutes at full sizes
    log(f"{workload.name} {label:<8} result    {computed!r} (seed {seed}); computing the NumPy reference")
    t0 = time.perf_counter()
    key = (workload.name, scale, seed)
    if key not in _REFERENCES:  # both sides check the same seed: B4's and B5's take a minute at full size
        _REFERENCES[key] = workload.reference(workload.params(scale), seed)
    expected = _REFERENCES[key]
    reference_s = time.perf_counter() - t0
    err = float(relative_error(np.float64(computed), np.float64(expected)))
    ok = bool(err <= workload.tolerance)
    log(f"{workload.name} {label:<8} check     {'OK' if ok else 'FAILED'}: {computed!r} against "
        f"{expected!r}, relative error {err:.3e} (reference in {reference_s:.1f} s)")
    return {"seed": seed, "value": computed, "reference": expected, "rel_error": err,
            "tolerance": workload.tolerance, "ok": ok, "reference_s": reference_s,
            "how": "NumPy float64 on the host CPUs, from the seed"}


# --- the two clusters


@contextlib.contextmanager
def spillway_cluster(options: Options, inventory: Inventory | None) -> Iterator[tuple[Any, dict]]:
    with open_cluster(options, inventory=inventory) as session:
        yield session.client, {
            "kind": session.kind,
            "n_workers": session.n_workers,
            "protocol": session.plan.protocol,
            "options": {k: v for k, v in options.as_config().items() if v not in (None, False)},
            "ucx_env": _ucx_env(session.client, session.plan.protocol),
            "transport": transport(session.client),
            "worker_transfer": _transfer_settings(session.client),
        }


@contextlib.contextmanager
def baseline_cluster(launch: LaunchPlan, options: Options, changes: dict) -> Iterator[tuple[Any, dict]]:
    from distributed import Client

    notes = []
    if launch.kind == "gpu":
        from dask_cuda import LocalCUDACluster

        protocol = "ucx"
        if not ucxx_installed():
            protocol = "tcp"
            notes.append("distributed-ucxx is not installed: baseline over TCP")
        kwargs = dict(protocol=protocol, CUDA_VISIBLE_DEVICES=list(launch.devices),
                      n_workers=launch.n_workers, dashboard_address=None,
                      silence_logs=logging.WARNING, **changes)
        cluster = LocalCUDACluster(**kwargs)
        described = f"LocalCUDACluster({', '.join(f'{k}={v!r}' for k, v in kwargs.items() if k != 'silence_logs')})"
    else:
        from distributed import LocalCluster

        protocol = "tcp"
        kwargs = dict(n_workers=launch.n_workers, threads_per_worker=options.threads_per_worker,
                      processes=True, host="127.0.0.1", dashboard_address=None)
        cluster = LocalCluster(silence_logs=logging.WARNING, **kwargs)
        described = f"LocalCluster({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
    with cluster, Client(cluster) as client:
        client.wait_for_workers(launch.n_workers, timeout=120)
        client.register_plugin(SpillCounter())
        yield client, {"kind": launch.kind, "n_workers": launch.n_workers, "protocol": protocol,
                       "cluster": described, "notes": notes, "ucx_env": _ucx_env(client, protocol),
                       "transport": transport(client), "worker_transfer": _transfer_settings(client)}


def _transfer_settings(client) -> dict:
    """The transfer settings as the workers read them (the same on every worker)."""
    return next(iter(client.run(_worker_transfer).values()), {})


def _ucx_env(client, protocol: str) -> dict:
    if protocol != "ucx":
        return {}
    envs = client.run(_worker_ucx)
    return next(iter(envs.values()), {})


# --- the whole benchmark


@dataclass
class Plan:
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
    #: record each workload's first timed run per worker (``--timeline``)
    timeline: bool = False


def check_fits(workloads: list[Workload], scale: str, kind: str, budget_bytes: int) -> None:
    """Refuse, before any memory is taken, a workload whose inputs cannot fit."""
    for w in workloads:
        need = w.input_bytes(scale)
        if need > budget_bytes:
            from spillway.service.sizes import format_bytes

            raise ParamError(
                f"sizes: {w.name} at {scale} needs {format_bytes(need)} of input, more than the "
                f"{format_bytes(budget_bytes)} the {kind} workers can hold; use --sizes tiny or small"
            )


def worker_bytes(plan: Plan) -> int:
    """Memory one worker holds before it spills: 80% of the smallest GPU (dask-cuda's
    default limit), or an even share of the host's memory."""
    import psutil

    if plan.launch.kind == "gpu" and plan.inventory is not None:
        sizes = [g.memory_total for g in plan.inventory.gpus if g.index in plan.launch.devices]
        if sizes:
            return int(0.8 * min(sizes))
    return psutil.virtual_memory().total // max(1, plan.launch.n_workers)


def groups(plan: Plan) -> list[tuple[dict[str, dict], list[Workload]]]:
    """Workloads that share cluster settings, in order, with each side's options changes
    (``{"spillway": ..., "baseline": ...}``); B2's device limit and B3's tiers are their own."""
    out: list[tuple[dict[str, dict], list[Workload]]] = []
    for w in plan.workloads:
        changes = {side: w.cluster_changes(plan.scale, plan.launch.kind, side) for side in ("spillway", "baseline")}
        if out and out[-1][0] == changes:
            out[-1][1].append(w)
        else:
            out.append((changes, [w]))
    return out


def run(plan: Plan, *, log: Callable[[str], None],
        spillway: Callable = spillway_cluster, baseline: Callable = baseline_cluster) -> dict:
    """Both sides of every workload; returns per-workload results and cluster descriptions."""
    from spillway.workflows.params import Target

    kind = plan.launch.kind
    # the same target on both sides, so both build the same graph from the same inputs
    target = Target(kind=kind, n_workers=plan.launch.n_workers, worker_bytes=worker_bytes(plan))
    results: dict[str, dict[str, SideResult]] = {w.name: {} for w in plan.workloads}
    clusters: dict[str, dict] = {}
    with dask.config.set({"distributed.admin.low-level-log-length": TRANSFER_LOG_LENGTH}):
        for changes, members in groups(plan):
            for side in ("spillway", "baseline"):
                mine = changes[side]
                if side == "spillway":
                    opener = lambda: spillway(plan.options.replace(**mine) if mine else plan.options,  # noqa: E731
                                              plan.inventory)
                else:
                    opener = lambda: baseline(plan.launch, plan.options, mine)  # noqa: E731
                running = []
                for w in members:
                    skip = None
                    if side == "baseline":
                        skip = w.baseline_skip or (None if plan.baseline else NO_BASELINE)
                    if skip:
                        results[w.name][side] = SideResult(skipped=skip)
                        log(f"{w.name} {side:<8} {skip}")
                    else:
                        running.append(w)
                if running:
                    _run_side(opener, running, side, plan, target, kind, results, clusters, log)
                for w in running if mine else ():
                    results[w.name][side].notes.append(
                        "cluster options of this workload: " + ", ".join(f"{k}={v}" for k, v in mine.items()))
    return {"results": results, "clusters": clusters}


def _run_side(opener, members, side, plan, target, kind, results, clusters, log):
    """Run ``members`` on one side; a failed workload gets a fresh cluster for the next."""
    pending = list(members)
    while pending:
        log(f"starting the {side} cluster")
        try:
            with opener() as (client, described):
                clusters.setdefault(side, described)
                while pending:
                    w = pending.pop(0)
                    try:
                        results[w.name][side] = run_workload(
                            client, w, scale=plan.scale, target=target, runs=plan.runs,
                            timeout=plan.timeout, kind=kind, log=log, label=side, timeline=plan.timeline)
                    except Exception as e:  # one workload failing must not end the benchmark
                        error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                        expected = w.baseline_expected_failure if side == "baseline" else None
                        results[w.name][side] = SideResult(error=error, expected_failure=expected)
                        log(f"{w.name} {side:<8} FAILED: {error}" + (f" (expected: {expected})" if expected else ""))
                        # the traceback goes to the log file only
                        logging.getLogger("spillway.bench.progress").info(
                            "%s on %s failed", w.name, side, exc_info=True)
                        break  # restart the cluster: the failure may have left it unusable
        except Exception as e:
            error = f"{side} cluster failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log(error)
            for w in pending:
                results[w.name][side] = SideResult(error=error)
            return
