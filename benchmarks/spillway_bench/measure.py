"""One timed run measured (its inputs persisted before the clock; the clock until every
output chunk is in worker memory and the devices are synchronised), and a side's timed
runs summed up: transfers from the workers' incoming-transfer logs, spills from spillway's
counters (timed by its tiered store; counted only on the baseline).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from spillway.memory.store import MOVES
from spillway.launch.plugins import worker_snapshot

from .bounds import forced_moves
from .timeline import in_window

#: transfers smaller than this are left out of bandwidth percentiles (headers, scalars)
MIN_TRANSFER_BYTES = 1_000_000
#: the chunk size from which the issue's 80%-of-peer-copy target applies
LARGE_TRANSFER_BYTES = 256 * 2**20


def synchronize_device(dask_worker=None) -> None:
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


def _held(dask_worker=None) -> int:
    return len(dask_worker.data)


def reset_peak(dask_worker=None) -> int | None:
    """Start the worker's tiered store's peak of held bytes again (None: no such store)."""
    reset = getattr(dask_worker.data, "reset_peak", None)
    return reset() if reset is not None else None


def _scheduler_tasks(dask_scheduler=None) -> int:
    return len(dask_scheduler.tasks)


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
    #: tasks the scheduler ran for the timed part (after dask's optimisation)
    tasks: int | None = None
    #: of ``seconds``: until the client knew every future finished (submission, the
    #: tasks, the scheduler's word back), and the devices' synchronisation after (the
    #: kernels still queued when the last task returned, and the round trip to ask)
    waited_s: float | None = None
    synchronized_s: float | None = None
    #: seconds of the run during which a worker was pinning a segment of its arena (the
    #: driver's locks held against every CUDA call on the node), summed over the workers;
    #: None where no worker grows an arena
    arena_pin_s: float | None = None
    #: the bytes each move must carry, from the stores' peaks and limits
    #: (:func:`.bounds.forced_moves`); None without spillway's store
    forced: dict | None = None


#: the store's counts of host bytes written below, by why (:class:`~spillway.memory.stats.TierStats`)
WRITTEN = ("drained", "room_written", "limit_written", "needed_written")


def spill_moves(before: dict, after: dict) -> dict:
    """Bytes and seconds of each move between tiers, summed over the workers, between two
    :func:`~spillway.launch.plugins.worker_snapshot` sets, and the time tasks waited on restores.
    Seconds and waits are None where no worker has spillway's tiered store (it alone
    times its copies; other stores' moves are only counted)."""
    moves = {m: {"bytes": 0, "seconds": 0.0} for m in MOVES}
    timed, wait, producer, alloc = False, 0.0, 0.0, 0.0
    # where the host buffers the moves took came from, and what getting them cost
    host = {"taken_from": {}, "room_s": 0.0, "new_s": 0.0, "ahead_s": 0.0, "touched_ahead": 0}
    # why host values went below: the drain, the machine's room, the host tier's limit;
    # and how much of it a task still waited for
    written = dict.fromkeys(WRITTEN, 0)
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
            alloc += new_stats.get("spill_alloc_s", 0.0) - old_stats.get("spill_alloc_s", 0.0)
            for why in WRITTEN:
                written[why] += new_stats.get(f"{why}_bytes", 0) - old_stats.get(f"{why}_bytes", 0)
            new_host, old_host = snap["store"].get("host") or {}, (old.get("store") or {}).get("host") or {}
            for source, n in (new_host.get("taken_from") or {}).items():
                host["taken_from"][source] = (host["taken_from"].get(source, 0) + n
                                              - (old_host.get("taken_from") or {}).get(source, 0))
            for key in ("room_s", "new_s", "ahead_s", "touched_ahead"):
                host[key] += new_host.get(key, 0.0) - old_host.get(key, 0.0)
        else:
            for m in MOVES:
                moves[m]["bytes"] += snap["spilled"].get(m, 0) - old.get("spilled", {}).get(m, 0)
    if not timed:
        for v in moves.values():
            v["seconds"] = None
    return {"moves": moves, "restore_wait_s": wait if timed else None,
            "spill_producer_wait_s": producer if timed else None,
            "spill_alloc_s": alloc if timed else None, "host_buffers": host if timed else None,
            "written_below": written if timed else None,
            "workers": len(after)}


def arena_pin_overlap(snapshots: dict, window: tuple[float, float]) -> float | None:
    """Seconds of ``window`` (wall clock) that the workers' arena pins took, summed over
    the workers; None where no worker keeps its pins' times."""
    total, seen = 0.0, False
    for snap in snapshots.values():
        pins = ((snap.get("store") or {}).get("host") or {}).get("arena_pins")
        if pins is None:
            continue
        seen = True
        for pin in pins:
            total += max(0.0, min(pin["stop"], window[1]) - max(pin["start"], window[0]))
    return total if seen else None


def _median_of(runs: list[dict], key: str) -> float | None:
    """The median of ``key`` over the runs that timed it; None where none did."""
    values = [r[key] for r in runs if r and r.get(key) is not None]
    return statistics.median(values) if values else None


def resident_bytes(snapshots: dict) -> dict | None:
    """The values' bytes per tier held by the workers' tiered stores, summed, and
    ``disk_stored``: what the disk holds of them, smaller where they compressed; None
    without a store."""
    stores = [snap["store"] for snap in snapshots.values() if snap.get("store")]
    if not stores:
        return None
    out = {tier: sum(st[f"{tier}_bytes"] for st in stores) for tier in ("device", "host")}
    out["disk"] = sum(st["disk_raw_bytes"] for st in stores)
    out["disk_stored"] = sum(st["disk_bytes"] for st in stores)
    return out


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


def median_forced(runs: list[dict | None]) -> dict | None:
    """The median forced bytes of each move and the median peak over ``runs``
    (:attr:`RunMeasure.forced`); None where no run has them."""
    runs = [r for r in runs if r]
    if not runs:
        return None
    return {"moves": {m: int(statistics.median(r["moves"][m] for r in runs)) for m in runs[0]["moves"]},
            "peak_bytes": int(statistics.median(r["peak_bytes"] for r in runs))}


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
    #: tasks of each timed run
    tasks: list[int] = field(default_factory=list)
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
    #: where the slowest timed run's time went per worker (``--timeline``)
    timeline: dict | None = None
    #: seconds of each timed run that arena pins took (:attr:`RunMeasure.arena_pin_s`)
    arena_pin_s: list[float | None] = field(default_factory=list)
    #: the first run on a cluster started for this side alone, in place of a warm-up
    #: (O3, O4): its seconds, and its bytes moved and spilled (:meth:`record_first`)
    first_s: float | None = None
    first: dict | None = None
    #: how the graph's rechunk was built on this side ("collective", "p2p", "tasks")
    rechunk_method: str | None = None
    #: each timed run's forced bytes (:attr:`RunMeasure.forced`)
    forced: list[dict] = field(default_factory=list)

    def record_first(self, measure: "RunMeasure") -> None:
        self.first_s = measure.seconds
        self.first = {"bytes_moved": measure.bytes_moved, "bytes_spilled": measure.bytes_spilled,
                      "spill": measure.spill, "persist_s": measure.persist_s, "tasks": measure.tasks,
                      "forced": measure.forced}

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
            "tasks": max(self.tasks) if self.tasks else None,
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
            "arena_pin_s": self.arena_pin_s,
            "timeline": self.timeline,
            "rechunk_method": self.rechunk_method,
            "first_s": self.first_s if self.error is None else None,
            "first_bytes_moved": (self.first or {}).get("bytes_moved"),
            "first_bytes_spilled": (self.first or {}).get("bytes_spilled"),
            "first_spill_moves": summarize_spills([(self.first or {}).get("spill")]),
            "first_persist_s": (self.first or {}).get("persist_s"),
            "forced_moves": median_forced(self.forced),
            "first_forced_moves": median_forced([(self.first or {}).get("forced")]),
        }


# --- the inputs: persisted before the clock starts


def split_inputs(client, collection, timeout: float):
    """Persist the root layers of ``collection`` (its generated inputs) and return
    ``(futures, collection over them)``. The keys stay the same, so nothing is
    recomputed, and graph optimisation cannot fuse input generation into the timed part.
    """
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
    from distributed import wait

    from spillway.datapath.collective.graph import futures_layer

    graph = collection.__dask_graph__()
    if not isinstance(graph, HighLevelGraph):
        raise TypeError(f"expected a layered dask graph, got {type(graph).__name__}")
    roots = [name for name, deps in graph.dependencies.items() if not deps]
    # a root persisted already (the user's field, :func:`.workloads.expressions.held`) is
    # its futures: waited for, not persisted again
    done = [name for name in roots if futures_layer(graph.layers[name])]
    roots = [name for name in roots if name not in done]
    held = [f for name in done for f in graph.layers[name].values()]
    keys = [k for name in roots for k in graph.layers[name]]
    tasks = {k: graph.layers[name][k] for name in roots for k in graph.layers[name]}
    futures = client.get(tasks, keys, sync=False) if keys else []
    wait(list(futures) + held, timeout=timeout)
    by_key = dict(zip(keys, futures))
    layers = dict(graph.layers)
    for name in roots:
        layers[name] = MaterializedLayer({k: by_key[k] for k in graph.layers[name]})
    rebuild, args = collection.__dask_postpersist__()
    return list(futures) + held, rebuild(HighLevelGraph(layers, graph.dependencies), *args)


def wait_released(client, timeout: float = 120) -> bool:
    """Wait until the scheduler knows no task and no worker holds data."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.run_on_scheduler(_scheduler_tasks) == 0 and not any(client.run(_held).values()):
            return True
        time.sleep(0.05)
    return False


def timed_run(client, collection, *, kind: str, timeout: float, keep_value: bool = False,
              check=None) -> RunMeasure:
    """One run of ``collection``: its inputs persisted, then the clock over persisting the
    rest. With ``keep_value`` the result comes back as :attr:`RunMeasure.value`: the first
    output chunk gathered (a scalar result), or where ``check`` is given, ``check(result)``
    (small lazy arrays) computed on the cluster from the persisted result after the clock
    stopped, for a result too large to gather."""
    from distributed import futures_of, wait

    start_persist = client.run(worker_snapshot)
    t0 = time.perf_counter()
    inputs, op = split_inputs(client, collection, timeout)
    persist_s = time.perf_counter() - t0
    client.run(reset_peak)
    before = client.run(worker_snapshot)
    window_start = time.time()
    start = time.perf_counter()
    persisted = client.persist(op)
    futures = futures_of(persisted)
    wait(futures, timeout=timeout)
    waited_s = time.perf_counter() - start
    if kind == "gpu":
        client.run(synchronize_device)
    seconds = time.perf_counter() - start
    window = (window_start, time.time())
    failed = [f for f in futures if f.status != "finished"]
    if failed:
        failed[0].result()  # raises the task's exception
    after = client.run(worker_snapshot)
    # the scheduler still knows every task of the timed part (its results are held), and
    # the persisted inputs beside them
    tasks = client.run_on_scheduler(_scheduler_tasks) - len(inputs)
    value = None
    # bounded like the run: a result that never reaches the client (its gather failing and
    # retried without end, as O4's check was on two H200s) fails this side, not the bench
    if keep_value and check is not None:
        value = tuple(f.result(timeout=timeout) for f in client.compute(list(check(persisted))))
    elif keep_value:
        value = futures[0].result(timeout=timeout)
    del persisted, futures, inputs, op

    transfers, moved = [], 0
    for snap in after.values():
        for t in snap["transfers"]:
            if in_window(t, window):
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
                      value=value, window=window, tasks=tasks, waited_s=waited_s,
                      synchronized_s=seconds - waited_s, arena_pin_s=arena_pin_overlap(after, window),
                      forced=forced_moves(before, after))


def timed_run_recorded(client, collection, *, record: bool, **kwargs) -> tuple[RunMeasure, dict | None]:
    """:func:`timed_run`, and where ``record`` is set, where its time went on each worker
    (:mod:`spillway_bench.timeline`; read after the clock stops)."""
    if not record:
        return timed_run(client, collection, **kwargs), None
    from . import timeline

    with timeline.recording(client) as rec:
        measure = timed_run(client, collection, **kwargs)
    return measure, rec.result(measure.window)
