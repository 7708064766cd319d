"""Prometheus metrics, collected when scraped from the job database and the workers."""

from __future__ import annotations

import math
import threading
import time

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from spillway.launch.plugins import worker_snapshot
from ..jobdb.health import Unavailable
from . import schemas
from .deps import Tenant
from .limits import OffLoopJSONRoute

router = APIRouter(tags=["service"], route_class=OffLoopJSONRoute)


def _device_memory(dask_worker):
    """(used, total) bytes of the worker's GPU, or None on a CPU worker."""
    from spillway.launch.plugins import PLUGIN_NAME

    if getattr(dask_worker.plugins.get(PLUGIN_NAME), "kind", "cpu") != "gpu":
        return None
    from spillway.options.gpus import discover

    inventory = discover()  # honours CUDA_VISIBLE_DEVICES: GPU 0 is this worker's
    if not len(inventory):
        return None
    gpu = inventory.gpus[0]
    return gpu.memory_total - gpu.memory_free, gpu.memory_total


class ServiceCollector:
    """Reads the queue from the job database and memory and spills from the workers; worker
    readings are cached a few seconds so frequent scrapes do not load the cluster."""

    def __init__(self, jobdb, queue, cache_s: float = 2.0):
        self.jobdb = jobdb
        self.queue = queue
        self.cache_s = cache_s
        self._cached = (0.0, {}, {})
        self._lock = threading.Lock()

    def _workers(self):
        with self._lock:
            t, snaps, devices = self._cached
            if time.monotonic() - t > self.cache_s:
                client = self.queue.session.client
                try:
                    snaps = client.run(worker_snapshot)
                    devices = client.run(_device_memory) if self.queue.session.kind == "gpu" else {}
                except Exception:
                    snaps, devices = {}, {}
                self._cached = (time.monotonic(), snaps, devices)
            return snaps, devices

    def collect(self):
        counts = self.jobdb.counts()
        yield GaugeMetricFamily("spillway_queue_depth", "Jobs waiting to start", value=counts["queued"])
        jobs = GaugeMetricFamily("spillway_jobs", "Jobs by state", labels=["state"])
        for state, n in counts.items():
            jobs.add_metric([state], n)
        yield jobs
        try:
            # the workers up now (an adaptive or Slurm cluster grows and shrinks)
            capacity = self.queue.worker_memory()
        except Exception:  # noqa: BLE001 (a scrape while the cluster is away leaves the gauge out)
            capacity = None
        if capacity is not None:
            yield GaugeMetricFamily("spillway_capacity_bytes", "Memory the job queue admits jobs against",
                                    value=capacity)
        yield CounterMetricFamily("spillway_job_spilled_bytes", "Bytes spilled by finished jobs",
                                  value=self.jobdb.spilled_total())
        snaps, devices = self._workers()
        memory = GaugeMetricFamily("spillway_worker_memory_bytes",
                                   "Memory a worker holds (RMM bytes on GPUs, RSS on CPUs)",
                                   labels=["worker", "measure"])
        spilled = CounterMetricFamily("spillway_worker_spilled_bytes", "Bytes a worker spilled, by tier",
                                      labels=["worker", "tier"])
        for addr, snap in snaps.items():
            if snap.get("current_bytes") is not None:
                memory.add_metric([addr, snap.get("memory_measure") or ""], snap["current_bytes"])
            for tier, n in snap.get("spilled", {}).items():
                spilled.add_metric([addr, tier], n)
        yield memory
        yield spilled
        yield from tier_gauges(snaps)
        used = GaugeMetricFamily("spillway_gpu_memory_used_bytes", "GPU memory in use", labels=["worker"])
        total = GaugeMetricFamily("spillway_gpu_memory_total_bytes", "GPU memory", labels=["worker"])
        for addr, value in devices.items():
            if value:
                used.add_metric([addr], value[0])
                total.add_metric([addr], value[1])
        yield used
        yield total


TIERS = ("device", "host", "disk")


def tier_gauges(snaps: dict):
    """Bytes each tier of the workers' stores holds now, per worker and over the cluster:
    ``spillway_tier_bytes{tier}`` and ``spillway_worker_tier_bytes{worker,tier}``. Workers
    without spillway's tiered store count their host memory (RSS) and nothing else."""
    per_worker = GaugeMetricFamily("spillway_worker_tier_bytes", "Bytes a worker's store holds, by tier",
                                   labels=["worker", "tier"])
    total = dict.fromkeys(TIERS, 0)
    for addr, snap in snaps.items():
        store = snap.get("store")
        if store:
            held = {t: int(store.get(f"{t}_bytes") or 0) for t in TIERS}
        else:
            held = {"host": int(snap.get("host_bytes") or 0)}
        for tier, n in held.items():
            per_worker.add_metric([addr, tier], n)
            total[tier] += n
    cluster = GaugeMetricFamily("spillway_tier_bytes", "Bytes the workers' stores hold, by tier", labels=["tier"])
    for tier, n in total.items():
        cluster.add_metric([tier], n)
    yield cluster
    yield per_worker


class ConnectionCollector:
    """The connection guard's counts (:class:`~.connections.ConnectionStats`), read from
    memory when scraped."""

    def __init__(self, stats):
        self.stats = stats

    def collect(self):
        s = self.stats
        yield GaugeMetricFamily("spillway_http_connections", "Open HTTP connections counted against the caps",
                                value=s.total)
        yield GaugeMetricFamily("spillway_http_connections_exempt", "Open HTTP connections of trusted proxies",
                                value=s.exempt)
        yield GaugeMetricFamily("spillway_http_connections_waiting",
                                "Connections waiting on their client (sending headers or a body, or not "
                                "reading an answer): the ones evicted first at the total cap",
                                value=len(s.waiting))
        yield GaugeMetricFamily("spillway_http_clients", "Client addresses holding connections",
                                value=len(s.by_addr))
        refused = CounterMetricFamily("spillway_http_connections_refused", "Connections refused (503) at a cap",
                                      labels=["cap"])
        refused.add_metric(["client"], s.refused_client)
        refused.add_metric(["total"], s.refused_total)
        yield refused
        yield CounterMetricFamily("spillway_http_connections_evicted",
                                  "Connections still sending headers closed (503) to admit a newcomer at the "
                                  "total cap", value=s.evicted)
        yield CounterMetricFamily("spillway_http_header_timeouts",
                                  "Connections closed (408) for not sending their headers in time", value=s.timed_out)
        yield CounterMetricFamily("spillway_http_headers_too_large",
                                  "Connections closed (431) for headers past --max-header-bytes",
                                  value=s.headers_too_large)
        yield CounterMetricFamily("spillway_http_write_timeouts",
                                  "Connections dropped for not reading an answer within --write-timeout",
                                  value=s.write_timeouts)


class BodyCollector:
    """The body limits' counts (:class:`~.limits.BodyStats`), read from memory when scraped."""

    def __init__(self, stats):
        self.stats = stats

    def collect(self):
        yield CounterMetricFamily("spillway_http_body_timeouts",
                                  "Requests answered 408 and closed for not sending their body within --body-timeout",
                                  value=self.stats.timed_out)
        yield CounterMetricFamily("spillway_http_bodies_too_large",
                                  "Requests answered 413 for a body past --max-request-bytes", value=self.stats.too_large)


def metrics_registry(jobdb, queue, connections=None, body_stats=None) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(Cached(ServiceCollector(jobdb, queue)))
    if connections is not None:
        registry.register(ConnectionCollector(connections))
    if body_stats is not None:
        registry.register(BodyCollector(body_stats))
    return registry


def metrics_response(registry: CollectorRegistry) -> Response:
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


#: seconds the database's and the workers' readings are served again before they are read anew
METRICS_CACHE_S = 5.0


class Cached:
    """A collector whose families are made at most once every ``max_age_s``, whatever the
    number of scrapers (each scrape read the database and every worker before, issue 53);
    the connection guard's counts, read from memory, stay live beside it."""

    def __init__(self, collector, max_age_s: float = METRICS_CACHE_S):
        self.collector = collector
        self.max_age_s = max_age_s
        self._made: tuple[float, list] = (-math.inf, [])
        self._lock = threading.Lock()

    def collect(self):
        with self._lock:  # one scrape reads, the others wait and share what it read
            made, families = self._made
            if time.monotonic() - made > self.max_age_s:
                families = list(self.collector.collect())
                self._made = (time.monotonic(), families)
        return iter(families)


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"},
                       401: {"description": "Missing, unknown, revoked or expired token"},
                       403: {"description": "The token is not an admin's"},
                       429: {"description": "Too many wrong tokens from this address; retry after Retry-After"},
                       503: {"model": schemas.Unavailable, "description": "The job database is unreachable"}})
def metrics(request: Request, tenant: Tenant):
    """Prometheus metrics, for an admin token (``spillway tenant add NAME --admin``;
    Prometheus' ``authorization`` with ``credentials_file``): queue depth, jobs by state,
    worker memory, bytes each tier holds (device, host, disk), spilled bytes. They name the
    workers' addresses and count every tenant's jobs, so tenants do not see them. Made at
    most every 5 s, however often scraped."""
    if not tenant.get("admin"):
        raise HTTPException(403, "metrics: an admin token only (spillway tenant add NAME --admin)")
    health = request.app.state.jobdb.health
    if health.down and health.probing:
        raise Unavailable(health)
    return metrics_response(request.app.state.metrics_registry)
