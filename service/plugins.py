"""Per-worker setup, as distributed worker plugins.

dask-cuda's own plugins (registered by LocalCUDACluster / ``dask cuda worker``) create the
RMM resource and pin CPU affinity; :class:`WorkerSetup` runs after them on every worker,
whichever launcher started it, and adds what spillway needs:

* the worker's kind (``gpu`` or ``cpu``) so workflows build chunks with CuPy or NumPy;
* allocation statistics over the worker's RMM resource, so peak memory is read from real
  allocations (temporaries included), not from the sizes of stored results;
* counters on the worker's spill buffers (bytes moved device -> host -> disk).

:func:`worker_snapshot` reads those back; the run report diffs two snapshots.
"""

from __future__ import annotations

import os
import time

from distributed.diagnostics.plugin import WorkerPlugin

PLUGIN_NAME = "spillway-setup"


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


class WorkerSetup(WorkerPlugin):
    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, track_allocations: bool = True):
        self.track_allocations = track_allocations
        self.kind = "cpu"
        self.spilled = {"device_to_host": 0, "host_to_disk": 0, "host_to_device": 0, "disk_to_host": 0}
        self.statistics = None
        self.started = time.time()

    def setup(self, worker):
        self.kind = "gpu" if _is_gpu_worker() else "cpu"
        if self.kind == "gpu":
            self._setup_gpu()
        self._count_spills(worker.data)

    def _setup_gpu(self):
        import cupy
        import rmm
        from rmm.allocators.cupy import rmm_cupy_allocator

        current = rmm.mr.get_current_device_resource()
        if self.track_allocations:
            if not isinstance(current, rmm.mr.StatisticsResourceAdaptor):
                current = rmm.mr.StatisticsResourceAdaptor(current)
                rmm.mr.set_current_device_resource(current)
            self.statistics = current
        # CuPy's own pool would hide allocations from RMM's pool and statistics
        cupy.cuda.set_allocator(rmm_cupy_allocator)

    def _count_spills(self, data):
        """Hook the zict buffers of the worker's store (dask-cuda's DeviceHostFile or
        distributed's SpillBuffer); each hook adds the bytes of what it moves."""
        from dask.sizeof import sizeof

        def counter(name):
            def callback(key, value):
                self.spilled[name] += sizeof(value)

            return callback

        device_buffer = getattr(data, "device_buffer", None)
        if device_buffer is not None and hasattr(device_buffer, "fast_to_slow_callbacks"):
            device_buffer.fast_to_slow_callbacks.append(counter("device_to_host"))
            device_buffer.slow_to_fast_callbacks.append(counter("host_to_device"))
        host_buffer = getattr(data, "host_buffer", None)
        if host_buffer is not None and hasattr(host_buffer, "fast_to_slow_callbacks"):
            host_buffer.fast_to_slow_callbacks.append(counter("host_to_disk"))
            host_buffer.slow_to_fast_callbacks.append(counter("disk_to_host"))
        elif hasattr(data, "fast_to_slow_callbacks"):  # SpillBuffer: host -> disk
            data.fast_to_slow_callbacks.append(counter("host_to_disk"))
            data.slow_to_fast_callbacks.append(counter("disk_to_host"))


def worker_snapshot(dask_worker) -> dict:
    """Counters of one worker, taken on the worker (``client.run(worker_snapshot)``)."""
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    incoming = sum(entry["total"] for entry in dask_worker.transfer_incoming_log)
    snap = {
        "kind": getattr(plugin, "kind", "cpu"),
        "time": time.time(),
        "transfers": [
            {"start": e["start"], "stop": e["stop"], "bytes": e["total"], "who": e["who"]}
            for e in dask_worker.transfer_incoming_log
        ],
        "transfer_incoming_bytes": incoming,
        "spilled": dict(getattr(plugin, "spilled", {})),
        "peak_bytes": None,
        "current_bytes": None,
        "memory_measure": None,
    }
    stats = getattr(plugin, "statistics", None)
    if stats is not None:
        counts = stats.allocation_counts
        base = getattr(plugin, "window_base", 0)
        snap.update(
            peak_bytes=int(base + counts.peak_bytes),
            current_bytes=int(base + counts.current_bytes),
            memory_measure="rmm",
        )
    else:
        monitor = dask_worker.monitor
        since = getattr(plugin, "window_start", 0.0)
        samples = [
            m for t, m in zip(monitor.quantities["time"], monitor.quantities["memory"]) if t >= since
        ]
        rss = int(monitor.get_process_memory())
        snap.update(peak_bytes=max(samples + [rss]), current_bytes=rss, memory_measure="rss")
    return snap


def reset_peak(dask_worker) -> None:
    """Open a new peak-memory window on one worker (the run report reads its peak)."""
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    if plugin is None:
        return
    plugin.window_start = time.time()
    stats = plugin.statistics
    if stats is not None:
        # RMM keeps a stack of counters: a pushed window counts from zero, so remember
        # the bytes already held to report absolute peaks
        if getattr(plugin, "window_open", False):
            stats.pop_counters()
        plugin.window_base = stats.allocation_counts.current_bytes
        stats.push_counters()
        plugin.window_open = True
