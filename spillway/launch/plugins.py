"""Per-worker setup, as distributed worker plugins.

dask-cuda's own plugins (registered by LocalCUDACluster / ``dask cuda worker``) create the
RMM resource and pin CPU affinity; :class:`WorkerSetup` runs after them on every worker,
whichever launcher started it, and adds what spillway needs:

* the worker's kind (``gpu`` or ``cpu``) so workflows build chunks with CuPy or NumPy;
* allocation statistics over the worker's RMM resource, so peak memory is read from real
  allocations (temporaries included), not from the sizes of stored results;
* counters on the worker's spill buffers (bytes moved device -> host -> disk);
* on GPU workers, zarr takes CuPy chunks (copied to the host as zarr takes them in), so a
  user's own ``da.to_zarr`` / ``xarray.to_zarr`` of device arrays writes
  (:mod:`spillway.memory.zarr_buffer`);
* with spillway's tiered store (:mod:`spillway.memory`): eviction by the queued tasks'
  next use, prefetch of the next tasks' inputs, and spill on demand when an RMM
  allocation fails;
* a worker log without the "Compute Failed" traceback of an output chunk the OS refused
  (:class:`~spillway.options.errors.StoreWriteError`: a full disk, a read-only directory),
  which the run says in one line on the client;
* the worker's tiers on each heartbeat (with its spill disk's rates, probed once when the
  worker starts), and its spill disk filling as an event, for the scheduler's capacity
  check (:mod:`spillway.memory.capacity`).

:func:`worker_snapshot` reads those back; the run report diffs two snapshots.
"""

from __future__ import annotations

import functools
import os
import threading
import time

from distributed.diagnostics.plugin import WorkerPlugin

from spillway import upstream

from . import warm_imports

PLUGIN_NAME = "spillway-setup"

#: clean-ups :meth:`WorkerSetup.teardown` runs on a GPU worker while its CUDA context is
#: alive, registered by the modules that make such resources in this process (the Zarr
#: readers of :mod:`spillway.workflows.zarr.device_io`): the cluster knows no workflow
_TEARDOWNS: list = []


def on_teardown(close) -> None:
    """Run ``close()`` (once, however often it is registered) when the worker plugin of this
    process tears down on a GPU worker."""
    if close not in _TEARDOWNS:
        _TEARDOWNS.append(close)


def _is_gpu_worker() -> bool:
    if not os.environ.get("CUDA_VISIBLE_DEVICES"):
        return False
    try:
        import cupy
    except ImportError:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _not_a_refused_write(record) -> bool:
    """False for distributed's "Compute Failed" record of a task whose exception is a
    :class:`~spillway.options.errors.StoreWriteError` (its repr is the record's fourth
    argument: distributed logs ``Exception: %r``)."""
    args = record.args if isinstance(record.args, tuple) else ()
    return not (str(record.msg).startswith("Compute Failed") and len(args) > 3
                and str(args[3]).lstrip("\"'").startswith("StoreWriteError("))


def quiet_refused_writes() -> None:
    """Leave refused output writes out of this worker process's log (once per process)."""
    import logging

    log = logging.getLogger("distributed.worker")
    if _not_a_refused_write not in log.filters:
        log.addFilter(_not_a_refused_write)


#: distributed's lines about a worker that scaling down (scale, adapt) retired, logged in
#: the process of its scheduler and nanny: the scheduler has forgotten it before its last
#: heartbeat, and its nanny ends it. Each is the expected end of a retired worker.
RETIREMENT_LINES = {
    "distributed.scheduler": ("Received heartbeat from unregistered worker",),
    "distributed.nanny": ("Worker process still alive after",),
}
#: where a leaving worker's own process logs its end (heartbeats and comms that the
#: scheduler closed first, the tasks its close cancels: "Async instruction ... ended with
#: CancelledError", one line per task running when Ctrl-C stopped a run), all left out once
#: the worker is leaving (:func:`quiet_leaving`)
LEAVING_LOGGERS = ("distributed.worker", "distributed.worker.state_machine", "distributed.core",
                   "distributed.batched")


def _not_a_retirement_line(record) -> bool:
    prefixes = RETIREMENT_LINES.get(record.name, ())
    return not str(record.msg).startswith(prefixes)


def quiet_retirement() -> None:
    """Leave the lines of retired workers (:data:`RETIREMENT_LINES`) out of this process's
    log: a notebook that adapts would print them at every scale-down (once per process)."""
    import logging

    for name in RETIREMENT_LINES:
        log = logging.getLogger(name)
        if _not_a_retirement_line not in log.filters:
            log.addFilter(_not_a_retirement_line)


class _Leaving:
    """A log filter of a worker's process: nothing once the worker is leaving (retired or
    closed), whose comms the scheduler closes under it."""

    def __init__(self, worker):
        from distributed.core import Status

        self.worker = worker
        self.leaving = {Status.closing, Status.closing_gracefully, Status.closed}

    def filter(self, record) -> bool:
        return self.worker.status not in self.leaving


def quiet_leaving(worker) -> None:
    """What ``worker``'s process logs once it is leaving stays out of the log (the lines a
    scale-down printed into notebooks); its warnings and errors while it runs stay in."""
    import logging

    for name in LEAVING_LOGGERS:
        log = logging.getLogger(name)
        log.filters = [f for f in log.filters if not isinstance(f, _Leaving)]
        log.addFilter(_Leaving(worker))


def quiet_retried_allocations() -> None:
    """RMM's pool logs each allocation it cannot serve at error level, on the process's
    stderr, before it raises; where spill on demand wraps the pool, that failure is a
    step of the allocation (the store spills, the allocation is retried and succeeds), so
    those lines reached users' output as errors of runs that completed. An allocation that
    fails after the retry still raises its MemoryError with RMM's message, which dask
    reports: only RMM's own log is lowered, to its critical level."""
    import rmm

    level = getattr(getattr(rmm, "level_enum", None), "critical", None)
    if level is not None:  # an RMM without its logger's levels keeps its own
        rmm.set_logging_level(level)


#: seconds without UCX progress after which ucxx's blocking progress mode progresses UCX
#: anyway (ucxx's own: 1 s; :func:`~spillway.upstream.tighten_progress_net`)
PROGRESS_NET_S = 0.005
#: seconds a kept pageable buffer waits for reuse before it goes back to the host: longer
#: than the gaps between the graphs of one piece of work, short beside an idle notebook.
#: 30 s was shorter than one out-of-core FFT's run and the pause before the next on one
#: H100 (10-15 s each): the third of the bench's runs found its buffers gone mid-run and
#: touched 27 GB anew (14.4 s against 9.1-10.9 s)
KEPT_IDLE_S = 120
#: the longest a worker's set-up waits for the warm-up thread's zarr before it installs the
#: host buffer (importing zarr itself, whatever the thread is doing)
ZARR_IMPORT_WAIT_S = 60


def _expire_kept(host) -> None:
    if host.kept_bytes:
        threading.Thread(target=host.expire, args=(KEPT_IDLE_S,), name="spillway-kept-expire", daemon=True).start()


class WorkerSetup(WorkerPlugin):
    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, track_allocations: bool = True, prefetch: bool = True, spill_on_demand: bool = True,
                 gc_freeze: bool = True):
        self.track_allocations = track_allocations
        self.prefetch = prefetch
        self.spill_on_demand = spill_on_demand
        self.gc_freeze = gc_freeze
        self._settler = None
        self.window_base = 0
        self.kind = "cpu"
        self.spilled = {"device_to_host": 0, "host_to_disk": 0, "host_to_device": 0, "disk_to_host": 0}
        self.statistics = None
        #: what the scheduler said last of what waits for this worker's keys (GPU workers'
        #: tiered store)
        self.scheduler_ranks = None
        self.started = time.time()

    def setup(self, worker):
        from spillway.launch.worker_config import follow_offload_config

        follow_offload_config()  # transfer-offload, where the process imported distributed first
        upstream.tighten_progress_net(PROGRESS_NET_S)
        quiet_refused_writes()
        quiet_leaving(worker)
        self.kind = "gpu" if _is_gpu_worker() else "cpu"
        store = _tiered_store(worker)
        from spillway.memory.capacity import DISK_AHEAD, HOST_WANTED, TIERS, report_tiers

        worker.metrics[TIERS] = report_tiers
        # the scheduler admitted a graph that spills: the arena grows without waiting (a
        # worker of another store has none, and takes the word all the same)
        host = getattr(store, "host", None)
        worker.stream_handlers[HOST_WANTED] = lambda **_: host.missed_arena() if host is not None else None
        # a graph admitted past this worker's device and host: what it must write to disk
        # goes while the host tier fills, not after (a worker of another store ignores it)
        worker.stream_handlers[DISK_AHEAD] = lambda nbytes=0, **_: self._write_ahead(worker, store, nbytes)
        if self.gc_freeze:
            from .collector import start_settling

            self._settler = start_settling(worker, lambda: upstream.at_work(worker))
        buffer = None
        if self.kind == "gpu":
            buffer = self._setup_gpu(store)
        if store is not None:
            self._wire_store(worker, store)
        else:
            self._count_spills(worker.data)
        return buffer

    def _setup_gpu(self, store):
        import cupy
        import rmm
        from rmm.allocators.cupy import rmm_cupy_allocator

        current = rmm.mr.get_current_device_resource()
        if store is not None and self.spill_on_demand and not _has(current, rmm.mr.FailureCallbackResourceAdaptor):
            # a failed allocation first spills what no running task holds, then retries
            current = rmm.mr.FailureCallbackResourceAdaptor(current, lambda nbytes: store.evict_for(nbytes) > 0)
            rmm.mr.set_current_device_resource(current)
            quiet_retried_allocations()
        if self.track_allocations:
            if not isinstance(current, rmm.mr.StatisticsResourceAdaptor):
                current = rmm.mr.StatisticsResourceAdaptor(current)
                rmm.mr.set_current_device_resource(current)
            self.statistics = current
        # CuPy's own pool would hide allocations from RMM's pool and statistics
        cupy.cuda.set_allocator(rmm_cupy_allocator if store is None else explained(rmm_cupy_allocator, store))
        # dask's store hands CuPy chunks to zarr, whose CPU buffer refuses them. Where zarr is
        # still being imported on the warm-up thread, the buffer is installed once it is in,
        # awaited (distributed sets a plugin up before the worker takes tasks), not imported
        # here on the event loop
        if warm_imports.ready("zarr"):
            _install_zarr_buffer()
            return None
        return _zarr_buffer_when_imported()

    def _wire_store(self, worker, store):
        from spillway.memory.policy import SchedulerRanks, next_use, running_inputs

        far = self.scheduler_ranks = SchedulerRanks()
        store.rank = next_use(worker, far)
        store.in_use = running_inputs(worker)
        store.name = f"worker {worker.name} ({worker.address})"
        store.on_disk_full = functools.partial(_say_disk_full, worker)
        store.start()
        from spillway.memory.disk import DiskTier

        for tier in store.below:
            if isinstance(tier, DiskTier):
                # its rate before any spill, for the scheduler's word on a graph past memory
                tier.start_probe()
        if self.statistics is not None:
            stats = self.statistics
            store.device_usage = lambda: self.window_base + stats.allocation_counts.current_bytes
        if store.books is not None:
            from tornado.ioloop import PeriodicCallback

            from spillway.memory.pause import TICK_MS, HostPause

            self.host_pause = HostPause(worker, store)
            callback = PeriodicCallback(self.host_pause.tick, TICK_MS)
            worker.periodic_callbacks["spillway-host-pause"] = callback
            callback.start()
            # pageable buffers kept for reuse go back to the host once spills stop, freed on a
            # thread of their own: unmapping tens of GB would hold the event loop
            expire = PeriodicCallback(lambda: _expire_kept(store.host), KEPT_IDLE_S * 1000 / 4)
            worker.periodic_callbacks["spillway-host-kept"] = expire
            expire.start()
        self._ask_next_use(worker, store, far)
        if self.prefetch:
            from concurrent.futures import ThreadPoolExecutor

            from tornado.ioloop import PeriodicCallback

            self._prefetch_pool = ThreadPoolExecutor(1, thread_name_prefix="spillway-prefetch")
            self._prefetching = False
            callback = PeriodicCallback(lambda: self._prefetch_tick(worker, store), 5)
            worker.periodic_callbacks["spillway-prefetch"] = callback
            callback.start()

    def _write_ahead(self, worker, store, nbytes: int) -> None:
        """The scheduler's word on a graph past this worker's device and host: the store
        writes ahead once the scheduler has said what waits for its keys since that graph
        came (:class:`~spillway.memory.policy.SchedulerRanks`). The ranks in hand predate
        it: its inputs, held here before its tasks came, rank as needed by no task until the
        next answer, and the drain wrote them to disk first (37.7 GB of one O4 run on one
        H100, read back)."""
        import asyncio

        ahead = getattr(store, "write_ahead", None)
        if ahead is None:
            return
        far = getattr(self, "scheduler_ranks", None)
        if nbytes <= 0 or far is None:
            ahead(nbytes)
            return

        async def asked_first():
            await far.ask(worker)
            ahead(nbytes)

        asyncio.ensure_future(asked_first())

    def _ask_next_use(self, worker, store, far) -> None:
        """Ask the scheduler what waits for this worker's keys while the store is filling
        (past half its device limit, or anything spilled): what its eviction order reads
        beside the tasks sent here (:class:`~spillway.memory.policy.SchedulerRanks`)."""
        import asyncio

        from tornado.ioloop import PeriodicCallback

        from spillway.memory.policy import ASK_EVERY_S

        asking = []

        def tick():
            if asking or not far.due():
                return
            limit = store.device_limit
            if not (store.host_bytes or store.below_bytes or (limit and store.device_bytes > limit / 2)):
                return
            task = asyncio.ensure_future(far.ask(worker))
            asking.append(task)
            task.add_done_callback(lambda _: asking.clear())

        callback = PeriodicCallback(tick, ASK_EVERY_S * 1000)
        worker.periodic_callbacks["spillway-next-use"] = callback
        callback.start()

    def _prefetch_tick(self, worker, store):
        from spillway.memory.policy import upcoming_inputs

        if self._prefetching:
            return
        keys = store.spilled(upcoming_inputs(worker))
        if not keys:
            return
        self._prefetching = True

        def run():
            try:
                store.prefetch(keys)
            except Exception:  # a failed prefetch leaves the value where it was
                import logging

                logging.getLogger("spillway.memory").exception("prefetch failed")
            finally:
                self._prefetching = False

        self._prefetch_pool.submit(run)

    def transition(self, key, start, finish, **kwargs):
        if self._settler is not None:
            self._settler.touch()

    def teardown(self, worker):
        pool = getattr(self, "_prefetch_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)
        if self.kind == "gpu":
            # while the CUDA context is alive: what this process's readers registered
            # (nvCOMP's codecs before their streams, the Zarr host-decode pool's buffers)
            for close in list(_TEARDOWNS):
                close()

    def _count_spills(self, data):
        """Hook the zict buffers of the worker's store (dask-cuda's DeviceHostFile or
        distributed's SpillBuffer); each hook adds the bytes of what it moves."""
        from dask.sizeof import sizeof

        def counter(name):
            def callback(key, value):
                self.spilled[name] += sizeof(value)

            return callback

        from spillway.upstream import spill_callbacks

        device = spill_callbacks(getattr(data, "device_buffer", None))
        if device is not None:
            device[0].append(counter("device_to_host"))
            device[1].append(counter("host_to_device"))
        host = spill_callbacks(getattr(data, "host_buffer", None)) or spill_callbacks(data)  # or a SpillBuffer
        if host is not None:
            host[0].append(counter("host_to_disk"))
            host[1].append(counter("disk_to_host"))


def _install_zarr_buffer() -> None:
    from spillway.memory import zarr_buffer

    zarr_buffer.install()


async def _zarr_buffer_when_imported() -> None:
    import asyncio

    await asyncio.to_thread(warm_imports.ready, "zarr", ZARR_IMPORT_WAIT_S)
    _install_zarr_buffer()


def _say_disk_full(worker, line: str) -> None:
    """Tell the scheduler that this worker's spill disk is full (from any thread)."""
    from spillway.memory.capacity import DISK_FULL

    worker.log_event(DISK_FULL, {"line": line})


def explained(allocate, store):
    """``allocate`` whose failure, once spill on demand has freed all it could, says so in
    one line naming the worker, the bytes asked for and each tier's bytes, instead of
    RMM's "maximum pool size exceeded"."""
    import functools

    from spillway.options.errors import DeviceMemoryExhausted, SpillDiskFull

    @functools.wraps(allocate)
    def allocate_or_explain(nbytes):
        try:
            return allocate(nbytes)
        except MemoryError as error:
            if getattr(store, "evict_met_full_disk", False) and store.disk_full:
                raise SpillDiskFull(store.disk_full) from error
            raise DeviceMemoryExhausted(store.exhausted(nbytes)) from error

    return allocate_or_explain


def _tiered_store(worker):
    from spillway.memory.store import TieredStore

    return worker.data if isinstance(worker.data, TieredStore) else None


def _has(resource, kind) -> bool:
    while resource is not None:
        if isinstance(resource, kind):
            return True
        resource = resource.get_upstream() if hasattr(resource, "get_upstream") else None
    return False


def worker_snapshot(dask_worker) -> dict:
    """Counters of one worker, taken on the worker (``client.run(worker_snapshot)``)."""
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    log = upstream.incoming_log(dask_worker)
    incoming = sum(entry["total"] for entry in log)
    snap = {
        "kind": getattr(plugin, "kind", "cpu"),
        "time": time.time(),
        "transfers": [
            {"start": e["start"], "stop": e["stop"], "bytes": e["total"], "who": e["who"]}
            for e in log
        ],
        "transfer_incoming_bytes": incoming,
        "spilled": dict(getattr(plugin, "spilled", {})),
        "store": None,
        "peak_bytes": None,
        "current_bytes": None,
        "memory_measure": None,
    }
    store = _tiered_store(dask_worker)
    if store is not None:
        summary = store.summary()
        pause = getattr(plugin, "host_pause", None)
        summary["host_pause"] = pause.summary() if pause is not None else None
        snap["store"] = summary
        snap["spilled"] = dict(summary["stats"]["bytes"])
    stats = getattr(plugin, "statistics", None)
    if stats is not None:
        counts = stats.allocation_counts
        base = getattr(plugin, "window_base", 0)
        snap.update(
            peak_bytes=int(base + counts.peak_bytes),
            current_bytes=int(base + counts.current_bytes),
            memory_measure="rmm",
        )
    # the rounds each exchange kind moved on this worker (the run's report says which the
    # cluster's exchanges took)
    from spillway.datapath.step.state import state_of

    steps = state_of(dask_worker)
    snap["exchange_rounds"] = dict(steps.moved_over) if steps is not None else {}
    host_peak, rss = upstream.process_memory(dask_worker, getattr(plugin, "window_start", 0.0))
    # the worker process's resident memory (pinned and pageable host tier, Python, CUDA's
    # host side), sampled by distributed's monitor: the host figure next to RMM's device one
    snap.update(host_peak_bytes=host_peak, host_bytes=rss)
    if stats is None:
        snap.update(peak_bytes=host_peak, current_bytes=rss, memory_measure="rss")
    return snap


def reset_peak(dask_worker) -> None:
    """Open a new peak-memory window on one worker (the run report reads its peak)."""
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    if plugin is None:
        return
    plugin.window_start = time.time()
    store = _tiered_store(dask_worker)
    if store is not None and store.books is not None:
        store.books.lowest_available = None
    stats = plugin.statistics
    if stats is not None:
        # RMM keeps a stack of counters: a pushed window counts from zero, so remember
        # the bytes already held to report absolute peaks
        if getattr(plugin, "window_open", False):
            stats.pop_counters()
        plugin.window_base = stats.allocation_counts.current_bytes
        stats.push_counters()
        plugin.window_open = True
