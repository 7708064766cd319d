"""Run each workload on spillway's cluster and on the plain baseline, and measure both.

For every workload and side: one warm-up and ``runs`` timed runs, each on fresh inputs (a
new seed, so new keys). Before the clock starts the run's random inputs are persisted;
the clock covers submitting the rest of the graph until every output chunk is in worker
memory (and, on GPUs, the devices are synchronised). Then the outputs and inputs are
released and the harness waits until the workers hold nothing, so one run's memory never
slows the next. Worker-to-worker bandwidth and bytes moved come from the workers'
incoming-transfer logs, bytes spilled from spillway's spill counters (registered on the
baseline's workers too; they only count, they change no setting).

The baseline is what a user gets without spillway: ``LocalCUDACluster(protocol="ucx")``
at dask-cuda's defaults on the same GPUs, or ``distributed.LocalCluster`` with the same
number of workers on CPU. Only the dashboard is off on both sides, and the transfer log
is made long enough to hold a whole run.
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

from ..errors import ParamError
from ..gpus import Inventory
from ..launch import LaunchPlan, open_cluster
from ..launch.plan import ucxx_installed
from ..options import Options
from ..plugins import WorkerSetup, worker_snapshot
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
    error: str | None = None

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


def timed_run(client, collection, *, kind: str, timeout: float) -> RunMeasure:
    from distributed import futures_of, wait

    inputs, op = split_inputs(client, collection, timeout)
    before = client.run(worker_snapshot)
    window_start = time.time()
    start = time.perf_counter()
    persisted = client.persist(op)
    futures = futures_of(persisted)
    wait(futures, timeout=timeout)
    if kind == "gpu":
        client.run(synchronize_device)
    seconds = time.perf_counter() - start
    failed = [f for f in futures if f.status != "finished"]
    if failed:
        failed[0].result()  # raises the task's exception
    after = client.run(worker_snapshot)
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
    return RunMeasure(seconds=seconds, transfers=transfers, bytes_moved=moved, bytes_spilled=spilled)


def run_workload(client, workload: Workload, *, scale: str, target, runs: int, timeout: float,
                 kind: str, log: Callable[[str], None], label: str) -> SideResult:
    """One warm-up and ``runs`` timed runs of ``workload``, each on fresh inputs."""
    result = SideResult()
    for i in range(runs + 1):
        built = workload.build(scale, target, SEED_BASE + i)
        result.source = built.source
        if built.note and built.note not in result.notes:
            result.notes.append(built.note)
        measure = timed_run(client, built.result, kind=kind, timeout=timeout)
        del built
        if not wait_released(client):
            result.notes.append("workers still held data 120 s after a run")
        what = "warm-up" if i == 0 else f"run {i}/{runs}"
        log(f"{workload.name} {label:<8} {what:<9} {measure.seconds:9.3f} s  "
            f"moved {measure.bytes_moved / 1e9:8.2f} GB  spilled {measure.bytes_spilled / 1e9:7.2f} GB")
        if i == 0:
            result.warmup_s = measure.seconds
            continue
        result.runs_s.append(measure.seconds)
        result.transfers.extend(measure.transfers)
        result.bytes_moved.append(measure.bytes_moved)
        result.bytes_spilled.append(measure.bytes_spilled)
    return result


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
                       "cluster": described, "notes": notes, "ucx_env": _ucx_env(client, protocol)}


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


def check_fits(workloads: list[Workload], scale: str, kind: str, budget_bytes: int) -> None:
    """Refuse, before any memory is taken, a workload whose inputs cannot fit."""
    for w in workloads:
        need = w.input_bytes(scale)
        if need > budget_bytes:
            from ..sizes import format_bytes

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


def groups(plan: Plan) -> list[tuple[dict, list[Workload]]]:
    """Workloads that share cluster settings, in order; B2's device limit is its own."""
    out: list[tuple[dict, list[Workload]]] = []
    for w in plan.workloads:
        changes = dict(w.gpu_cluster) if plan.launch.kind == "gpu" else {}
        if out and out[-1][0] == changes:
            out[-1][1].append(w)
        else:
            out.append((changes, [w]))
    return out


def run(plan: Plan, *, log: Callable[[str], None],
        spillway: Callable = spillway_cluster, baseline: Callable = baseline_cluster) -> dict:
    """Both sides of every workload; returns per-workload results and cluster descriptions."""
    from workflows.params import Target

    kind = plan.launch.kind
    # the same target on both sides, so both build the same graph from the same inputs
    target = Target(kind=kind, n_workers=plan.launch.n_workers, worker_bytes=worker_bytes(plan))
    results: dict[str, dict[str, SideResult]] = {w.name: {} for w in plan.workloads}
    clusters: dict[str, dict] = {}
    with dask.config.set({"distributed.admin.low-level-log-length": TRANSFER_LOG_LENGTH}):
        for changes, members in groups(plan):
            for side in ("spillway", "baseline"):
                if side == "spillway":
                    opener = lambda: spillway(plan.options.replace(**changes) if changes else plan.options,  # noqa: E731
                                              plan.inventory)
                else:
                    opener = lambda: baseline(plan.launch, plan.options, changes)  # noqa: E731
                _run_side(opener, members, side, plan, target, kind, results, clusters, log)
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
                            timeout=plan.timeout, kind=kind, log=log, label=side)
                    except Exception as e:  # one workload failing must not end the benchmark
                        error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                        results[w.name][side] = SideResult(error=error)
                        log(f"{w.name} {side:<8} FAILED: {error}")
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
