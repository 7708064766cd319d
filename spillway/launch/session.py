"""A cluster from the options: the plan against this machine, the backend that starts the
workers (or the scheduler attached to), the client, spillway's worker plugins, and the
:class:`Session` that :func:`open_cluster` yields."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from spillway.options.errors import GpusBusy, OptionsError
from spillway.options.gpus import Inventory, discover
from spillway.options.settings import Options
from .attach import (ATTACH_TIMEOUT_S, attach_security, file_address, first_line, refuse_closed,
                     refuse_non_scheduler)
from .backend import backend_for
from .closing import close_timeout_s, closer
from .interrupts import held_from_workers
from .main_guard import check_main_guard
from .plan import HostProbe, LaunchPlan, plan
from .spec import WorkerSpec, worker_specs
from .tls import temporary_tls
from .ucx_env import quiet_ucx, start_client_ucx
from . import warm_imports

logger = logging.getLogger("spillway")

#: seconds the workers of a new cluster have to register (a pinned pool of tens of GB
#: takes about half a minute per worker to take)
START_TIMEOUT_S = 120


@dataclass
class Session:
    client: Any
    cluster: Any
    plan: LaunchPlan
    options: Options
    #: "gpu" or "cpu": what the workers compute on (read from the workers when attached)
    kind: str
    n_workers: int
    #: seconds each step of the cluster's start took, in order (see :func:`open_cluster`)
    start_steps: dict = field(default_factory=dict)

    @property
    def scheduler_address(self) -> str:
        return self.client.scheduler.address

    @property
    def dashboard_link(self) -> str | None:
        try:
            return self.client.dashboard_link
        except Exception:
            return None

    def write_scheduler_file(self, path: str) -> None:
        """distributed's scheduler file, with the cluster's TLS files beside the address where
        it has them (``security: true`` makes them where only this session knows): a client
        attaching with ``--scheduler-file`` reads both. Readable by its owner only then."""
        self.client.write_scheduler_file(path)
        options = self.options
        if options.tls_ca_file:
            import json

            with open(path) as f:
                info = json.load(f)
            info["tls"] = {"tls_ca_file": options.tls_ca_file, "tls_cert": options.tls_cert,
                           "tls_key": options.tls_key}
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(info, f)


def start_cluster(options: Options, launch: LaunchPlan, specs: tuple[WorkerSpec, ...] = ()):
    """The cluster object for a local plan (None when attaching), from the backend of the
    plan's kind (:mod:`.backend`); ``specs``: the GPU workers' (:func:`~.spec.worker_specs`)."""
    return backend_for(launch.kind).start(options, launch, specs)


#: seconds a new cluster waits for GPUs another process holds: a cluster that is closing
#: gives its pool back within seconds, and back-to-back runs should not fail on it
GPU_BUSY_WAIT_S = 20.0


def plan_when_free(options: Options, host: HostProbe, *, wait_s: float = GPU_BUSY_WAIT_S) -> LaunchPlan:
    """The plan against this machine's GPUs as they are now, reading them again each
    second for up to ``wait_s`` while one is held by another process; then the plan's
    one-line refusal with the numbers."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            return plan(options, discover(), host)
        except GpusBusy as e:
            if time.monotonic() >= deadline:
                raise
            if not said:
                logger.warning("%s; waiting up to %.0f s for it", e, wait_s)
                said = True
            time.sleep(1.0)


def connect_client(options: Options, cluster=None):
    """A client of ``cluster``, else of the scheduler the options name: a scheduler file
    that is not there, an address that refuses or one that is no dask scheduler is refused
    in one line (:mod:`.attach`; distributed waits for a missing file for ever)."""
    from distributed import Client

    if cluster is not None:
        return Client(cluster, security=options.dask_security)
    if options.scheduler_file:
        if not os.path.isfile(options.scheduler_file):
            raise OptionsError(f"scheduler-file: {options.scheduler_file!r} does not exist (`spillway up "
                               "--scheduler-file-out` or a batch job writes one)")
        where, kwargs = f"scheduler-file: the scheduler of {options.scheduler_file!r}", {
            "scheduler_file": options.scheduler_file}
        address = file_address(options.scheduler_file)
    else:
        where, kwargs = f"scheduler-address: {options.scheduler_address!r}", {"address": options.scheduler_address}
        address = options.scheduler_address
    refuse_closed(where, address, scheduler_file=options.scheduler_file)
    security = attach_security(options)
    refuse_non_scheduler(where, address, security)
    try:
        return Client(**kwargs, security=security, timeout=f"{ATTACH_TIMEOUT_S}s")
    except OSError as e:
        # the timeout's text is distributed's: "Timed out trying to connect to ... after 30 s"
        raise OptionsError(f"{where} did not answer: {first_line(e)}") from None


def _over_ucx(launch: LaunchPlan, options: Options) -> bool:
    """Whether this process's client talks to its cluster over UCX: a local cluster of that
    protocol, or the scheduler it attaches to named ``ucx://``."""
    if launch.kind != "attach":
        return launch.protocol == "ucx"
    address = options.scheduler_address or (file_address(options.scheduler_file) if options.scheduler_file else None)
    return bool(address) and address.startswith("ucx")


def register_plugins(client, options: Options) -> None:
    """The scheduler's capacity check, spillway's worker plugins (and the nannies' death
    relay) on the scheduler of ``client``: on the workers up now, and on every worker that
    joins later (a cluster that scales registers them once, with no worker yet)."""
    from spillway.memory.capacity import CapacityPlugin
    from spillway.memory.policy import NextUse
    from spillway.launch.plugins import WorkerSetup

    if options.data_plane:
        from spillway.datapath.plane import DataPlanePlugin

        # first: its warm-up maps each peer's pool (about 2 s a peer on H200s, one after
        # another in a worker: 4.6-7.7 s with four GPUs), in the background from here, while
        # the other plugins register
        client.register_plugin(DataPlanePlugin())
    _hold_to_the_tiers(client, CapacityPlugin)
    # what waits for each worker's keys beyond the tasks sent to it: its eviction order
    client.register_plugin(NextUse())
    client.register_plugin(WorkerSetup(prefetch=options.prefetch, spill_on_demand=options.spill_on_demand,
                                       gc_freeze=options.gc_freeze))
    if options.gc_freeze:
        _settle_the_scheduler(client)
    _relay_deaths(client)
    _exchange_in_bulk(client, options)
    _tighten_progress_net(client)


def _tighten_progress_net(client) -> None:
    """ucxx's safety net for missed wake-ups at a few milliseconds in this process and the
    scheduler's, as :class:`~spillway.launch.plugins.WorkerSetup` sets it on the workers."""
    from .. import upstream
    from spillway.launch.plugins import PROGRESS_NET_S

    upstream.tighten_progress_net(PROGRESS_NET_S)
    try:
        client.run_on_scheduler(upstream.tighten_progress_net, PROGRESS_NET_S)
    except Exception as e:  # noqa: BLE001 (a scheduler without spillway keeps ucxx's 1 s)
        logger.debug("the scheduler keeps ucxx's progress net: %s: %s", type(e).__name__, e)


def setup_workers(client, options: Options, *, wait_for: int | None = None, timeout: float = 120,
                  steps: dict | None = None) -> tuple[str, int]:
    """Register the capacity check and the worker plugins and return (kind, number of
    workers); ``steps`` (where given) takes the seconds of each step."""
    clock = _Steps(steps)
    if wait_for:
        client.wait_for_workers(wait_for, timeout=timeout)
        clock.done("workers")
    register_plugins(client, options)
    # each worker's tiers reach the scheduler now, not at its next heartbeat: a graph sent
    # at once is checked against them
    client.run(_heartbeat, on_error="ignore")
    kinds = client.run(_worker_kind)
    if not kinds:
        raise RuntimeError(f"scheduler {client.scheduler.address} has no workers")
    values = set(kinds.values())
    if len(values) > 1:
        raise RuntimeError(f"mixed GPU and CPU workers are not supported: {kinds}")
    kind = values.pop()
    clock.done("plugins")
    # the results path warms while the planes map their peers' pools (two H200s: 0.1-0.2 s
    # once the workers import CuPy's serializers off their loops, :mod:`.warm_imports`)
    results = send_to_client(client, sorted(kinds), _device_value) if kind == "gpu" else []
    if options.data_plane:
        _planes_ready(client)
        clock.done("data plane")
    if results:
        received(client, results)
        clock.done("results path")
    if options.gc_freeze:
        # last: what the warm-ups made is frozen with the rest
        _settle(client)
        clock.done("settle")
    if kind == "gpu":
        client.run(_arena_may_grow, on_error="ignore")
    return kind, len(kinds)


def _arena_may_grow(dask_worker=None) -> None:
    from spillway.memory.worker import cluster_ready

    cluster_ready(dask_worker)


class _Steps:
    """Seconds since the last step, written under each step's name into ``into``."""

    def __init__(self, into: dict | None):
        self.into = into if into is not None else {}
        self.last = time.perf_counter()

    def done(self, name: str) -> None:
        now = time.perf_counter()
        self.into[name] = now - self.last
        self.last = now


#: bytes of the value each GPU worker sends the client when the cluster opens: past UCX's
#: rendezvous threshold, so the path a result takes (through host staging: the client's
#: process takes no CUDA IPC, :data:`~.ucx_env.CLIENT_UCX`) is the one warmed
WARM_RESULT_BYTES = 4 * 2**20


def _device_value(nbytes: int):
    import cupy

    return cupy.zeros(nbytes, dtype="uint8")


def send_to_client(client, workers: list[str], make, nbytes: int = WARM_RESULT_BYTES) -> list:
    """The client receives a value made by ``make(nbytes)`` from each worker before the
    cluster is handed out (these are its futures; :func:`received` takes them): the first
    result of a run no longer pays the client's first contact with each worker (UCX's
    endpoints and staging buffers), and UCX in the client makes the CUDA stream it copies
    results with while the GPUs still have room for it. On two H200s filled past their
    memory, a client whose first CuPy result came at the end of the run could not create
    that stream, and its gather failed and was retried for minutes."""
    return [client.submit(make, nbytes, workers=[w], allow_other_workers=False, pure=False) for w in workers]


def received(client, futures: list, timeout: float = 60) -> None:
    """Each of ``futures``' values (:func:`send_to_client`) brought to this process, then
    released. A failure is a debug line: the run still gets its results the usual way."""
    try:
        for future in futures:
            future.result(timeout=timeout)  # the value itself comes to this process
    except Exception as e:  # noqa: BLE001 (a warm-up: the first run warms what is left)
        logger.debug("the results path was not warmed: %s: %s", type(e).__name__, e)
    finally:
        client.cancel(futures)


def _planes_ready(client) -> None:
    """Return once every worker's data plane has its endpoints to the others and, on GPUs,
    each peer's pool mapped: a cluster is ready when it says it is, and its first exchange
    does not pay first contact (each plane bounds its wait:
    :data:`~spillway.datapath.plane.plugin.READY_TIMEOUT_S`)."""
    from spillway.datapath.plane.plugin import plane_ready

    peers = {a: n for a, n in client.run(plane_ready, on_error="return").items() if isinstance(n, int)}
    short = {a: n for a, n in peers.items() if n < len(peers) - 1}
    if short:
        logger.info("data plane: %d of %d workers reach fewer than all their peers yet (%s); those connect at "
                    "their first gather", len(short), len(peers), ", ".join(f"{a}: {n}" for a, n in sorted(short.items())))


def _settle(client) -> None:
    """Every process of the cluster settled once it is ready, its modules and warm-ups
    frozen out of later full collections (:mod:`~spillway.launch.collector`); before the first run,
    not at its first quiet moment after a run that paid a full collection."""
    from spillway.launch.collector import settle_server

    took = client.run(settle_server, on_error="return")
    try:
        took["scheduler"] = client.run_on_scheduler(settle_server)
    except Exception as e:  # noqa: BLE001 (a scheduler without spillway collects as Python does)
        logger.debug("the scheduler is not settled: %s: %s", type(e).__name__, e)
    logger.debug("settled: %s", {k: v for k, v in took.items() if isinstance(v, dict)})


def _settle_the_scheduler(client) -> None:
    """The scheduler's process settled at its quiet moments (:mod:`~spillway.launch.collector`)."""
    from spillway.launch.collector import SchedulerSettle

    try:
        client.register_plugin(SchedulerSettle())
    except Exception as e:  # noqa: BLE001 (a scheduler without spillway collects as Python does)
        logger.debug("the scheduler will not be settled: %s: %s", type(e).__name__, e)


def _hold_to_the_tiers(client, plugin_class) -> None:
    """Every graph of every client is held against the tiers before it runs
    (:mod:`~spillway.memory.capacity`); the workers report their tiers from their next heartbeat. A
    scheduler that cannot load the plugin (attached, without spillway) runs graphs
    unchecked, as distributed does, and the session says so."""
    try:
        client.register_plugin(plugin_class())
    except Exception as e:  # noqa: BLE001 (the cluster runs without the check, as before it)
        logger.warning("graphs on this scheduler are not checked against the workers' tiers: %s: %s",
                       type(e).__name__, e)


def _relay_deaths(client) -> None:
    """Each nanny tells the scheduler why its worker died (:class:`.deaths.DeathRelay`), so
    that a run names the reason; workers without a nanny have nobody to tell."""
    from .deaths import DeathRelay

    try:
        client.register_plugin(DeathRelay())
    except Exception as e:  # noqa: BLE001 (a lost worker is still named, without its reason)
        logger.warning("the nannies will not report why a worker died: %s: %s", type(e).__name__, e)


def _exchange_in_bulk(client, options: Options) -> None:
    """Rechunks and halos run as one exchange: one step a worker where the option
    ``exchange`` is ``step`` (:mod:`~spillway.datapath.step`: its scheduler plugin binds
    the steps to the workers and joins them), the pieces' tasks otherwise
    (:mod:`~spillway.datapath.collective`, whose plugin spreads the assemblies and tells a
    client the cluster's room); this process's dask hands its peer-to-peer rechunks to
    them. A scheduler that cannot load the plugins still runs the pieces' tasks, with every
    assembly where its barrier ran."""
    from spillway.datapath.collective import CollectivePlacement, use_on
    from spillway.datapath.step.coordinator import StepCoordinator

    try:
        if options.exchange == "step":
            client.register_plugin(StepCoordinator())
        client.register_plugin(CollectivePlacement(fit_fraction=options.collective_group_fraction))
    except Exception as e:  # noqa: BLE001
        logger.warning("rechunks' assemblies will not be spread over the workers: %s: %s", type(e).__name__, e)
    use_on(client)


def stop_exchanging(client) -> None:
    """The end of :func:`_exchange_in_bulk` for this process: its rechunks on ``client``'s
    cluster are dask's own again."""
    from spillway.datapath.collective.method import stop_using

    stop_using(client)


def scheduler_workers(client) -> dict[str, dict]:
    """The workers the scheduler has now, by address, asked of it. Not
    ``client.scheduler_info(n_workers=-1)``, which fills the client's cached identity and
    then reads it back: the client's periodic refresh asks for no workers, and where its
    answer lands in between (a loaded machine widens the gap) the cluster reads empty."""
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def _arrived(client) -> int | None:
    try:
        return len(scheduler_workers(client))
    except Exception:  # the scheduler may be gone too
        return None


async def _heartbeat(dask_worker):
    await dask_worker.heartbeat()


def _worker_kind(dask_worker):
    from spillway.launch.plugins import PLUGIN_NAME

    return dask_worker.plugins[PLUGIN_NAME].kind


@contextlib.contextmanager
def open_cluster(options: Options, *, inventory: Inventory | None = None,
                 tls_dir: str | os.PathLike | None = None) -> Iterator[Session]:
    """The session of a new cluster from ``options`` (or of the scheduler they name).
    With ``security: true`` its TLS files are made first (:mod:`.tls`), in ``tls_dir``
    where given (the service's state directory), and the session's options name them."""
    # distributed (the worker plugins, the nannies' death relay) loads here and not with the
    # package: a run refused before it starts is refused before distributed's import, which
    # took 0.9-1.0 s of a 1.5 s refusal on the GPU hosts
    from .deaths import start_failure, watch_worker_deaths

    if not options.attach:
        check_main_guard()
    began, steps = time.perf_counter(), {}
    clock = _Steps(steps)
    if inventory is None and not options.attach:
        launch = plan_when_free(options, HostProbe.here())
    else:
        launch = plan(options, inventory or Inventory(), HostProbe.here())
    for note in launch.notes:
        logger.warning(note)
    if launch.kind == "attach" or launch.protocol == "ucx":
        quiet_ucx()  # this process and the workers it starts inherit it
    if _over_ucx(launch, options):
        start_client_ucx(gpu=launch.kind == "gpu" or bool((inventory or discover()).gpus))
    if launch.kind == "gpu":
        # the CuPy results' deserializers import while the workers start
        warm_imports.start(warm_imports.CLIENT)
    clock.done("plan")
    with contextlib.ExitStack() as stack:
        options = stack.enter_context(temporary_tls(options, tls_dir))
        deaths = stack.enter_context(watch_worker_deaths())
        specs = worker_specs(options, launch) if launch.kind == "gpu" else ()
        # the workers never take the terminal's Ctrl-C: this process stops them (:mod:`.interrupts`)
        with held_from_workers() if launch.kind != "attach" else contextlib.nullcontext():
            cluster = start_cluster(options, launch, specs)
            if cluster is not None:
                # the plan's memory is each worker's share; a pool's fraction is of the whole GPU
                timeout = max((close_timeout_s(s, m * s.workers_per_gpu)
                               for s, m in zip(specs, launch.device_memory)), default=close_timeout_s(None))
                # registered first, so it runs after the client's close: client, workers, scheduler
                stack.push(closer(cluster, timeout))
        clock.done("start")
        client = connect_client(options, cluster)
        stack.callback(client.close)
        # before the client's close: this process's rechunks leave the cluster's collective
        stack.callback(stop_exchanging, client)
        clock.done("client")
        expected = launch.n_workers or 1
        try:
            kind, n = setup_workers(client, options, wait_for=expected, timeout=START_TIMEOUT_S, steps=steps)
        except TimeoutError as e:
            raise start_failure(expected, _arrived(client), START_TIMEOUT_S, deaths.messages) from e
        # where a slow start went, for whoever opened it (the notebook's log, `spillway run -v`)
        logger.info("%d %s worker%s ready in %.1f s (%s)", n, kind.upper(), "" if n == 1 else "s",
                    time.perf_counter() - began, ", ".join(f"{k} {v:.1f} s" for k, v in steps.items()))
        yield Session(client=client, cluster=cluster, plan=launch, options=options, kind=kind, n_workers=n,
                      start_steps=steps)
