"""Capacity for user code: every graph any client sends to a spillway cluster is held
against the workers' tiers before a task of it runs, and the computations running stop
when the tiers fill anyway.

Why on the scheduler: users call ``x.persist()`` and ``dask.compute(...)`` on a plain
``distributed.Client`` as often as through spillway's wrappers, and only the scheduler
sees every graph. It sees it as tasks, though, without their sizes; the expression the
client sent says them (a dask array's chunks and dtype), and the scheduler reads that
expression in one place only, distributed's graph materialization. This module wraps
it in the scheduler's process (:func:`install_sizes`, through the seam of
:mod:`~spillway.upstream`): it returns the
graph as before, with each key's bytes as one more annotation
(:data:`~spillway.memory.graph_bytes.NBYTES`), which distributed hands to
scheduler plugins with the graph. Where the wrapper cannot read sizes (another
collection type, another distributed), graphs pass unchecked, as before.

:class:`CapacityPlugin` (registered by :func:`spillway.launch.session.setup_workers`):

* **before a graph runs** (``update_graph``, called before the graph's first
  transition): what the cluster holds (the bytes of the keys in memory, and the outputs
  of graphs admitted and still running), plus what this graph holds at its most (its new
  outputs from their chunk shapes, and its intermediates while they live, its tasks run
  in dask's order: :func:`~spillway.memory.graph_bytes.peak_bytes`), against
  device + host tier + spill disk as the workers report them on each heartbeat
  (:data:`TIERS`; the disk counted in values at the ratio its compressed values have
  now). A graph whose keys all held at once fit device + host tier is admitted without
  that run (a user's compute far below the tiers pays a sum of its sizes, not a pass over
  its tasks). A graph past them is refused: its new keys fail at once with
  :class:`~spillway.options.errors.AdmissionError`, one line with the numbers and what to do, and are
  released; nothing of it runs, and what the cluster held stays. A graph with no sizes
  (dataframes, delayed, futures) is not checked.
* **a graph admitted past device + host tier** (what the cluster holds plus its peak):
  its client alone (on the shared service other tenants use the same scheduler) is told
  in one printed line what it writes to the spill disks and how long that takes at
  their rates (:func:`disk_line`, :func:`~spillway.memory.admission.disk_traffic`: the bytes
  of its peak past device + host beside what the cluster holds, written once and read
  back once, the workers' even shares at the slowest worker's rates, which each
  worker's disk tier measures from its spills, and before any from a probe at its
  start); the scheduler logs it too, and records it as an event. ``spillway run``
  writes it beside its progress (:func:`disk_lines`). Traffic under :data:`QUIET_S` at
  those rates is not told: once the cluster holds more than device + host, every small
  compute of a held array passes them too.
* **when the tiers fill anyway** (a store's write met a full disk: the task that needed
  the room fails with :class:`~spillway.options.errors.SpillDiskFull`, and the store says so as an event,
  :data:`DISK_FULL`, naming its worker): the newest computation still running whose
  bytes are on that worker or whose tasks wait to run there stops, its outputs done or
  not failed with that line and released, so their spilled bytes leave the disk; the
  other computations (on the shared service, other tenants' jobs) run on, and should the
  disk fill again the next newest stops. The graphs whose outputs were all in memory
  before (held arrays) stay.

Keys refused or stopped stay on the scheduler as erred keys without data until their
client lets them go, so what is built on them fails with the same line (rather than as
"lost dependencies"); as for any erred key, a graph sent again under the same keys while
the client holds the first result fails with it too.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from distributed.diagnostics.plugin import SchedulerPlugin

from spillway import upstream
from spillway.options.errors import AdmissionError, SpillDiskFull
from spillway.memory.admission import CAPACITY, Capacity, DiskTraffic, combine, disk_traffic
from spillway.memory.graph_bytes import NBYTES, graph_bytes, peak_bytes
from spillway.options.sizes import format_bytes

logger = logging.getLogger("spillway")

PLUGIN_NAME = "spillway-capacity"
#: the workers' heartbeat metric with their tiers (:func:`report_tiers`)
TIERS = "spillway-tiers"
#: the event a worker's store logs when its spill disk is full
DISK_FULL = "spillway-disk-full"
#: told to every worker as a graph that will spill past the devices is admitted: their
#: pinned arenas grow from then on at full speed instead of waiting for a quiet worker
HOST_WANTED = "spillway-host-wanted"
#: the scheduler's word to a worker: a graph admitted goes past your device and host by
#: ``nbytes`` (your share of what it writes to disk), which your drain may write ahead;
#: ``nbytes`` 0 once every admitted graph is in memory (nothing more to write ahead)
DISK_AHEAD = "spillway-disk-ahead"
#: seconds the handler waits for workers that have not reported their tiers yet (one that
#: joined since its last heartbeat) before it answers without them
REPORT_WAIT_S = 5.0
#: the mark of the disk-traffic line printed at a client (:func:`disk_lines` takes it)
DISK_LINE = "spillway-disk-traffic"
#: a graph whose disk traffic takes less than this at the disks' rates is not told (the
#: scheduler's debug log has it); where no worker knows its rates yet, one that puts less
#: than QUIET_BYTES on the disk
QUIET_S = 1.0
QUIET_BYTES = 2**30
#: graphs with more tasks than this are checked on their outputs alone (the run in
#: dask's order takes about a second per million tasks on the scheduler's event loop)
PEAK_TASKS = 500_000
#: the least fraction of their bytes that compressed values are counted at on disk
MIN_RATIO = 0.05
#: seconds after a computation is stopped for a worker's full disk in which another
#: signal of that disk (the same fill, told by the task's error and the store's event)
#: stops nothing more
STOP_QUIET_S = 2.0


# --- sizes from the expression, in the scheduler's process


def install_sizes() -> bool:
    """Wrap distributed's graph materialization (once per process,
    :func:`~spillway.upstream.wrap_graph_materialization`) so that each graph comes with its keys'
    bytes as the :data:`NBYTES` annotation; False where this distributed materializes
    graphs otherwise (graphs then pass unchecked, and the log says so once)."""
    return upstream.wrap_graph_materialization(_add_sizes)


def _add_sizes(expr, dsk, annotations: dict) -> None:
    sizes = graph_bytes(expr, dsk)
    if sizes:
        annotations.setdefault(NBYTES, {}).update(sizes)


def uninstall_sizes() -> None:
    upstream.unwrap_graph_materialization()


# --- on the workers


def report_tiers(dask_worker) -> dict:
    """A worker's tiers and what its disk tier holds (the :data:`TIERS` heartbeat metric,
    :func:`~spillway.memory.admission.worker_capacity`)."""
    from spillway.memory.admission import worker_capacity

    return worker_capacity(dask_worker)


# --- on the scheduler


@dataclass
class Graph:
    """A graph admitted and not yet all in memory: its client, its new keys (outputs) and
    its new tasks (outputs and intermediates)."""

    client: str
    keys: set
    tasks: set = field(default_factory=set)
    at: float = field(default_factory=time.monotonic)


class CapacityPlugin(SchedulerPlugin):
    name = PLUGIN_NAME
    idempotent = True

    def __init__(self):
        self.scheduler = None
        self.graphs: list[Graph] = []
        #: admitted outputs not yet in memory -> their bytes
        self.pending: dict = {}
        self.refused = 0
        self.stops = 0
        #: times a client asked for the cluster's tiers (:meth:`tiers`)
        self.asked = 0
        #: graphs admitted past device + host whose disk traffic was said
        self.told = 0
        self._sizes = False
        #: worker (or None: not known) -> when a computation was last stopped for its disk
        self._stopped_at: dict = {}
        #: workers told that spills are coming
        self._told: set = set()
        #: workers told a share of disk bytes to write ahead, not yet told it ended
        self._ahead_told: set = set()

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        self._sizes = install_sizes()
        scheduler.handlers[CAPACITY] = self.tiers

    async def tiers(self) -> dict:
        """The :data:`CAPACITY` handler: each worker's last :data:`TIERS` report by address
        (``reports``), waiting up to :data:`REPORT_WAIT_S` for workers that have none yet,
        and the addresses still without one (``missing``: workers without spillway's
        plugin, or slow to report). The heartbeats carry the reports already, so admission
        asks no worker."""
        import asyncio

        self.asked += 1
        deadline = time.monotonic() + REPORT_WAIT_S
        while True:
            reports = self._reports()
            missing = [a for a in upstream.worker_addresses(self.scheduler) if a not in reports]
            if not missing or time.monotonic() >= deadline:
                return {"reports": reports, "missing": missing}
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        if self._sizes:
            uninstall_sizes()
            self._sizes = False

    # --- what the cluster has

    def capacity(self) -> tuple[Capacity, float] | None:
        """The tiers the workers reported last, in bytes of values (None before any
        reported), and the fraction of their bytes that values on the disks take there
        (1.0 where nothing compressed): a disk whose values compress to a quarter holds
        four times its room of values like them."""
        reports = self._reports()
        if not reports:
            return None
        capacity = combine(reports, with_stored=True)
        stored = sum(r.get("disk_stored", 0) for r in reports.values())
        raw = sum(r.get("disk_raw", 0) for r in reports.values())
        ratio = min(1.0, max(MIN_RATIO, stored / raw)) if raw else 1.0
        if ratio < 1.0:
            capacity = replace(capacity, disk_bytes=int(capacity.disk_bytes / ratio))
        return capacity, ratio

    def _reports(self) -> dict:
        """Each worker's last :data:`TIERS` report, by address (those that sent one)."""
        reports = upstream.worker_metric(self.scheduler, TIERS)
        return {a: r for a, r in reports.items() if isinstance(r, dict)}

    def held(self) -> int:
        """Bytes of the values the cluster holds: keys in memory, and admitted outputs
        still being computed."""
        return upstream.held_bytes(self.scheduler) + sum(self.pending.values())

    # --- a graph arrives

    def update_graph(self, scheduler, *, client, keys, tasks, annotations, priority, stimulus_id, **kwargs):
        self.scheduler = scheduler
        self._prune()
        new = [k for k in keys if upstream.key_state(scheduler, k) == "released" and k not in self.pending]
        if not new:
            return
        run = [k for k in tasks if upstream.key_state(scheduler, k) == "released"]
        sizes = annotations.get(NBYTES) or {}
        capacity = self.capacity() if sizes else None
        held = peak = None
        if capacity is not None:
            held = self.held()
            peak = self._peak(scheduler, new, run, sizes, priority, held, capacity[0])
            line = self._over(new, sizes, held, peak, *capacity)
            if line is not None:
                self._refuse(scheduler, client, new, line, stimulus_id)
                return
        spills = capacity is not None and held + sum(sizes.values()) > capacity[0].device_bytes
        self.graphs.append(Graph(client, set(new), set(run)))
        for k in new:
            self.pending[k] = sizes.get(k, 0)
        if spills:
            # all its keys at once beside what the cluster holds pass the devices: it may
            # spill (no run in dask's order for this: a graph that holds less at its most
            # only has the arenas grown a little early)
            self.want_host(scheduler)
        if peak is not None:
            self._tell_disk(scheduler, client, new, held, peak, capacity[0])

    def want_host(self, scheduler) -> None:
        """Tell each worker, once, that spills are coming (:data:`HOST_WANTED`). A fresh
        worker's arena grows only while it is idle (its page faults slowed a user's first
        small computations), so without the word a fresh cluster's first spills would
        find it short and take their host buffers at the rate the host first hands out
        memory; with it, the arena grows while the graph's first tasks run."""
        for address, report in upstream.worker_metric(scheduler, TIERS).items():
            # a worker reports its tiers once spillway's plugin is on it, which takes the word
            if address not in self._told and isinstance(report, dict):
                self._told.add(address)
                scheduler.worker_send(address, {"op": HOST_WANTED})

    def _write_ahead(self, scheduler, to_disk: int) -> None:
        """Tell each worker its share of a graph's disk bytes (by its device and host
        tiers, as the graph's values spread), which its drain writes ahead of the host
        tier filling (:meth:`~spillway.memory.store.TieredStore.write_ahead`)."""
        memory = {a: r.get("device", 0) + r.get("host", 0) for a, r in self._reports().items()}
        total = sum(memory.values())
        if not total:
            return
        for address, nbytes in memory.items():
            share = int(to_disk * nbytes / total)
            if upstream.has_worker(scheduler, address) and share > 0:
                scheduler.worker_send(address, {"op": DISK_AHEAD, "nbytes": share})
                self._ahead_told.add(address)

    def _end_write_ahead(self) -> None:
        """Every admitted graph is in memory: the workers told to write ahead stop (the
        next graph's inputs, held before its tasks ask for them, look needed by no task)."""
        told, self._ahead_told = self._ahead_told, set()
        for address in told:
            if upstream.has_worker(self.scheduler, address):
                self.scheduler.worker_send(address, {"op": DISK_AHEAD, "nbytes": 0})

    def _peak(self, scheduler, new, run, sizes, priority, held: int, capacity: Capacity) -> int | None:
        """Bytes the graph holds at its most (its new outputs, and its intermediates while
        they live, its tasks in dask's order; its outputs alone past :data:`PEAK_TASKS`
        tasks); None where all its keys held at once beside what the cluster holds fit
        device + host, or its inputs failed."""
        if held + sum(sizes.values()) <= capacity.device_bytes + capacity.host_bytes:
            # all its keys held at once (its outputs among them) are at least what it holds
            # at its most: it fits in memory, and its tasks need not be run in dask's order
            # (a pass over every task and its dependencies) to say so. Most graphs are far
            # below the tiers
            return None
        run = list(run)
        if any(upstream.key_state(scheduler, d) == "erred"
               for k in run for d in upstream.dependency_keys(scheduler, k)):
            return None  # it fails with what its inputs failed with, not for room
        outputs = sum(sizes.get(k, 0) for k in new)
        if len(run) > PEAK_TASKS:
            return outputs
        run.sort(key=lambda k: priority.get(k, ()))
        aliases = {k: target for k in run if (target := upstream.alias_target(scheduler, k)) is not None}
        return max(outputs, peak_bytes(run, lambda k: upstream.dependency_keys(scheduler, k),
                                       sizes, set(new), aliases))

    def _over(self, new, sizes, held: int, peak: int | None, capacity: Capacity, ratio: float) -> str | None:
        """The refusal line of a graph whose peak beside what the cluster holds is past
        device + host tier + disk; None where it fits."""
        if peak is None or held + peak <= capacity.total_bytes:
            return None
        self.refused += 1
        outputs = sum(sizes.get(k, 0) for k in new)
        return refusal_line(_what(new), len(new), outputs, peak - outputs, held, capacity, self._directories(),
                            ratio)

    def _tell_disk(self, scheduler, client: str, new, held: int, peak: int, capacity: Capacity) -> None:
        """An admitted graph whose peak beside what the cluster holds is past device + host
        tier: say at its client alone (other tenants share the scheduler), in the
        scheduler's log and as an event, what it writes to disk and for how long."""
        memory = capacity.device_bytes + capacity.host_bytes
        # what the cluster held past memory before this graph is on disk already (or
        # counted for the graph that put it there): this graph's own part goes after it
        to_disk = min(peak, held + peak - memory)
        if to_disk <= 0:
            return
        self._write_ahead(scheduler, to_disk)
        traffic = disk_traffic(to_disk, self._reports())
        line = disk_line(_what(new), traffic, peak, held, capacity)
        if _quiet(traffic):
            logger.debug("client %s: %s", client, line)
            return
        self.told += 1
        told = upstream.print_at_client(scheduler, client, line, DISK_LINE)
        scheduler.log_event("spillway-capacity", {"action": "to-disk", "client": client, "keys": len(new),
                                                  "bytes": traffic.nbytes, "seconds": traffic.seconds,
                                                  "told": told, "message": line})
        logger.info("client %s: %s", client, line)

    def _refuse(self, scheduler, client, new, line, stimulus_id) -> None:
        self._fail(client, new, AdmissionError(line), f"spillway-refused-{stimulus_id}")
        scheduler.log_event("spillway-capacity", {"action": "refused", "client": client, "keys": len(new),
                                                  "message": line})
        # the client's error says it; the log is for whoever reads the scheduler's
        logger.info("%s", line)

    # --- keys finish

    def transition(self, key, start, finish, *args, **kwargs):
        # called for every transition of every task, of every client's graphs
        if finish != "erred":
            if self.pending and (finish == "memory" or finish == "forgotten"):
                self.pending.pop(key, None)
                if not self.pending and self._ahead_told:
                    self._end_write_ahead()
            return
        self.pending.pop(key, None)
        if not self.pending and self._ahead_told:
            self._end_write_ahead()
        text, worker = upstream.erred_text(kwargs)
        line = _disk_full_line(text)
        if line is not None:
            self.scheduler.loop.add_callback(self.stop, line, worker)

    def log_event(self, topic, msg):
        if topic == DISK_FULL and isinstance(msg, dict) and msg.get("line"):
            self.scheduler.loop.add_callback(self.stop, msg["line"], upstream.event_worker(msg))

    def stop(self, line: str, worker: str | None = None) -> int:
        """A worker's spill disk is full: stop the newest computation still running whose
        tasks hold bytes on ``worker`` or wait to run there (any worker's where ``worker``
        is None or none of them is there): its new keys fail with ``line`` and are
        released, so their bytes leave the workers and their disks. The other
        computations, other clients' among them, run on; should the disk fill again
        (after :data:`STOP_QUIET_S`: the first stop's bytes take a moment to leave),
        the next newest stops. The graphs all in memory (held arrays) stay. Returns the
        keys stopped."""
        scheduler = self.scheduler
        now = time.monotonic()
        if now - self._stopped_at.get(worker, -STOP_QUIET_S) < STOP_QUIET_S:
            return 0  # the same fill, told twice (the task's error and the store's event)
        running = [g for g in self.graphs if upstream.client_known(scheduler, g.client)
                   and any(upstream.key_state(scheduler, k) not in (None, "memory") for k in g.keys)]
        there = self._on(worker)
        if there:
            running = [g for g in running if g.tasks & there or g.keys & there] or running
        if not running:
            return 0
        newest = max(running, key=lambda g: g.at)
        stopped = 0
        for graph in self._built_on(newest):
            live = [k for k in graph.keys if upstream.scheduler_task(scheduler, k) is not None]
            upstream.fail_keys(scheduler, graph.client, live, SpillDiskFull(line),
                               f"spillway-disk-full-{time.time()}")
            self.graphs.remove(graph)
            for k in graph.keys:
                self.pending.pop(k, None)
            stopped += len(live)
        self._stopped_at[worker] = now
        self.stops += 1
        scheduler.log_event("spillway-capacity", {"action": "stopped", "keys": stopped, "client": newest.client,
                                                  "worker": worker, "message": line})
        logger.info("%s; stopped the newest computation there (client %s, %d keys released)", line, newest.client,
                    stopped)
        return stopped

    def _built_on(self, graph: Graph) -> list[Graph]:
        """``graph`` and the graphs admitted since whose tasks wait for its keys (a
        ``compute`` of a persisted array), and theirs in turn: one computation."""
        out, keys = [graph], set(graph.keys)
        while True:
            waiting = {d for k in keys for d in upstream.dependent_keys(self.scheduler, k)}
            more = [g for g in self.graphs if g not in out and g.tasks & waiting]
            if not more:
                return out
            out += more
            keys = set().union(*(g.keys for g in more))

    def _on(self, worker: str | None) -> set:
        """The keys ``worker`` holds (in memory or on its disk) or runs or will run."""
        return upstream.keys_on_worker(self.scheduler, worker)

    def _fail(self, client: str, keys: list, exception: Exception, stimulus_id: str) -> None:
        upstream.fail_keys(self.scheduler, client, keys, exception, stimulus_id)

    def _prune(self) -> None:
        """Forget the graphs whose keys are all in memory (held now) or gone."""
        self.graphs = [g for g in self.graphs
                       if any(upstream.key_state(self.scheduler, k) not in (None, "memory") for k in g.keys)]

    def _directories(self) -> list[str]:
        out = []
        for report in upstream.worker_metric(self.scheduler, TIERS).values():
            if isinstance(report, dict) and report.get("disk_directory") and report["disk_directory"] not in out:
                out.append(report["disk_directory"])
        return out


def _what(keys) -> str:
    from dask.utils import key_split

    return "compute" if any("finalize" in str(key_split(k)) for k in keys) else "persist"


def refusal_line(what: str, n_keys: int, outputs: int, intermediates: int, held: int, capacity: Capacity,
                 directories: list[str], ratio: float = 1.0) -> str:
    """The one line of a graph refused before it ran: what it would hold, what the cluster
    holds, each tier and what to do."""
    need = held + outputs + intermediates
    parts = f"its {n_keys} new output{'s' if n_keys != 1 else ''} ({format_bytes(outputs)}, from their chunk shapes)"
    if intermediates > 0:
        parts += f" and its intermediates at their most ({format_bytes(intermediates)}, its tasks in dask's order)"
    disk = f"disk {format_bytes(capacity.disk_bytes)}"
    if capacity.disk_free_bytes is not None:
        written = f" + {format_bytes(capacity.disk_stored_bytes)} spilled" if capacity.disk_stored_bytes else ""
        packed = f", values stored at {ratio:.0%} of their bytes" if ratio < 1.0 else ""
        disk += (f" ({format_bytes(capacity.disk_free_bytes)} free{written}, less a reserve of "
                 f"{format_bytes(capacity.disk_reserve_bytes)}{packed})")
    where = f" (spilling to {directories[0]}{' and others' if len(directories) > 1 else ''})" if directories else ""
    return (f"{what} refused before it ran: {parts} beside the {format_bytes(held)} the cluster holds need "
            f"{format_bytes(need)}, more than device + host tier + disk hold, {format_bytes(capacity.total_bytes)} "
            f"(device {format_bytes(capacity.device_bytes)} + host tier {format_bytes(capacity.host_bytes)} + "
            f"{disk}, {capacity.n_workers} worker{'s' if capacity.n_workers != 1 else ''}); release held arrays "
            f"(del them, or client.cancel) or give the workers a larger local-directory{where}")


def disk_line(what: str, traffic: DiskTraffic, peak: int, held: int, capacity: Capacity) -> str:
    """The one line of a graph admitted past device + host tier: its bytes that go to disk,
    the traffic they make, and the time at the slowest worker's disk rates."""
    n = traffic.n_workers
    workers = f"{n} worker{'s' if n != 1 else ''}"
    head = (f"{what} past device + host tier: {format_bytes(traffic.nbytes)} of the {format_bytes(peak)} it holds "
            f"at its most go to the spill disk, beside the {format_bytes(held)} the cluster holds (device "
            f"{format_bytes(capacity.device_bytes)} + host tier {format_bytes(capacity.host_bytes)}), written once "
            f"and read back at least once: {format_bytes(2 * traffic.nbytes)} of disk traffic")
    if traffic.seconds is None:
        return f"{head}; how long is not known: no worker has measured its spill disk's rate ({workers})"
    return (f"{head}, about {format_seconds(traffic.seconds)} at the disks' rates (the slowest of {workers}: "
            f"{format_bytes(traffic.share)} at {format_bytes(int(traffic.write_rate))}/s write and "
            f"{format_bytes(int(traffic.read_rate))}/s read{_measured(traffic.rates_from)})")


def _quiet(traffic: DiskTraffic) -> bool:
    """Whether the disk traffic is too short to tell the client: once the cluster holds
    more than device + host, every compute of a held array goes past them too, by a few
    bytes of sums, and a line for each would bury the one that matters."""
    if traffic.seconds is None:
        return traffic.nbytes < QUIET_BYTES
    return traffic.seconds < QUIET_S


def _measured(source: str | None) -> str:
    return {"spills": ", measured from its spills", "probe": ", measured by its probe at start",
            "probe and spills": ", measured from its spills and its probe"}.get(source or "", "")


def format_seconds(seconds: float) -> str:
    """Seconds as people read them: 0.04 s, 3.2 s, 95 s (1.6 min), 2.1 h."""
    if seconds < 1:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds:.0f} s ({seconds / 60:.1f} min)"
    return f"{seconds / 3600:.1f} h"


@contextlib.contextmanager
def disk_lines(client, take: Callable[[str], bool]):
    """Within the block, the disk-traffic lines the scheduler prints at ``client`` go to
    ``take`` first (a command's progress stream, a run's report); those it returns False
    for, and every other print, print as before."""
    routed = upstream.route_prints(client, DISK_LINE, take)
    try:
        yield
    finally:
        upstream.unroute_prints(client, routed)


def _disk_full_line(text) -> str | None:
    """The line of a task that failed with :class:`SpillDiskFull` (from distributed's
    ``exception_text``, the exception's repr)."""
    prefix = f"{SpillDiskFull.__name__}("
    if not isinstance(text, str) or not text.startswith(prefix):
        return None
    try:
        value = ast.literal_eval(text[len(prefix):-1])
    except (ValueError, SyntaxError):
        return text
    return value if isinstance(value, str) else text
