"""Every hook spillway has into a part of dask, distributed, dask-cuda, distributed-ucxx,
ucxx, zict, dask-jobqueue and zarr that upstream does not promise to keep, in one place.

Each seam is one small adapter below, registered with :func:`seam`: the upstream name it
touches, the distribution and the versions it was read against (``pyproject.toml`` bounds
each of them above at the next minor release not yet read), the feature of spillway that
stands on it, and a ``check`` that says whether the installed upstream still has the shape
the adapter expects. ``tests/test_upstream_contract.py`` runs every check, one test
per seam, so that a dependency bump fails one named test rather than a user's run.

Where a seam is not there or not of the expected shape, its adapter does without it: the
feature it serves is off (the capacity check passes graphs unchecked, the data plane leaves
gathers to distributed's comm, ...), :func:`off` says so once in the log, and no user's
graph fails for it. A seam is added as one adapter and one :func:`seam` entry; nothing else
in spillway names the private parts (``grep`` for them finds this module alone), nor the
internal ones that are not private by their name (:data:`INTERNAL`: distributed's scheduler
and worker state, above all), which the rest of spillway reads through the adapters here.

To add a seam: a ``check`` registered with :func:`seam` (its name, the upstream names, the
distribution and the releases read, what goes without it) that returns None or why not,
and beside it the adapter the rest of spillway calls, which starts with
``if not usable(name): <do without>``. The contract test picks the new seam up by itself.

Nothing here imports spillway: every other module of the cluster may import it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("spillway.upstream")

#: the releases each seam was read against, per distribution
DASK = ("2026.7.1", "2026.8.0")
DISTRIBUTED = ("2026.7.1", "2026.8.0")
DASK_CUDA = ("26.10.0",)
UCXX = ("0.52.0",)
ZICT = ("3.0.0",)
DASK_JOBQUEUE = ("0.9.0",)
ZARR = ("3.1.6", "3.4.2")


@dataclass(frozen=True)
class Seam:
    #: spillway's name for the seam (the contract test's id)
    name: str
    #: the upstream names it touches, dotted
    upstream: str
    #: the distribution they come from (its version is what the log names)
    package: str
    #: the releases of ``package`` the adapter was read against
    checked: tuple[str, ...]
    #: what of spillway goes without it (the log says this is off)
    serves: str
    #: None where the installed upstream has the shape the adapter expects, else why not;
    #: raises ImportError where ``package`` is not installed
    check: Callable[[], str | None]


SEAMS: dict[str, Seam] = {}

#: private names of other packages that spillway may use outside this module, and why
#: (Python's own, documented and kept); tests/test_upstream_contract.py fails on
#: any other ``x._name`` outside this module whose name spillway does not define itself,
#: and on any import of a private name or module of another package
PRIVATE_OUTSIDE = {
    "_exit": "os._exit: a child process's exit without the parent's cleanup (Python's documented call)",
    "_getframe": "sys._getframe: the caller's frame, to find the main script's line (documented in sys)",
    "_inheriting": "multiprocessing's process._inheriting: set while a spawned process re-imports the main "
                   "module (what multiprocessing's own spawn check reads; unchanged since Python 2.6)",
}


#: the objects of distributed whose parts are named by what they are named in distributed
#: itself: the scheduler handed to a plugin, a worker, a worker's state machine
SCHEDULERS = ("scheduler", "dask_scheduler")
WORKERS = ("worker", "dask_worker")
WORKER_STATES = ("state",)
#: distributed's names for a TaskState, WorkerState and ClientState (of the scheduler's
#: or a worker's): every attribute of one of them is internal, whatever its name
STATE_HOLDERS = ("ts", "dts", "ws", "cs")

#: the internal names of the upstream parts spillway touches that are not private by their
#: name: distributed's scheduler and worker state (documented as internal, its attributes
#: renamed between releases) and the public-looking attributes the seams read. Only this
#: module reads or writes them; tests/test_upstream_contract.py fails on any of them
#: elsewhere (an attribute, getattr and its kin, an import), naming file:line. A name mapped
#: to None is upstream's alone (no object of spillway's has it) and counts on any object; a
#: name mapped to receivers counts on an object named so (``scheduler.tasks``,
#: ``worker.state``, ``state.tasks``), as spillway's own objects share the word
INTERNAL: dict[str, tuple[str, ...] | None] = {
    # distributed's scheduler and worker state: TaskState, WorkerState, ClientState
    **dict.fromkeys((
        "who_has", "has_what", "processing_on", "waiting_on", "waiters", "who_wants", "wants_what",
        "worker_restrictions", "loose_restrictions", "host_restrictions", "resource_restrictions", "run_spec",
        "exception_blame", "erred_on", "has_lost_dependencies", "waiting_for_data", "needs_what",
        "task_prefix_count", "long_running", "executing_count", "unrunnable", "data_needed", "in_flight_tasks",
        "in_flight_workers", "missing_dep_flight", "busy_workers", "task_groups", "task_prefixes",
        "replicated_tasks", "erred_tasks", "idle_task_count", "transfer_incoming_count", "transfer_incoming_bytes",
        "transfer_incoming_log", "transfer_outgoing_log", "transfer_outgoing_count", "transfer_outgoing_bytes",
        "transfer_outgoing_count_limit", "transfer_outgoing_count_total", "transfer_outgoing_bytes_total",
        "scheduler_delay", "peekn")),
    **dict.fromkeys(("tasks",), SCHEDULERS + WORKER_STATES),
    **dict.fromkeys(("workers", "running", "clients", "queued", "idle", "saturated", "transitions"), SCHEDULERS),
    **dict.fromkeys(("executing", "ready", "constrained"), WORKER_STATES),
    **dict.fromkeys(("state", "monitor"), WORKERS),
    # distributed's other parts read by the seams
    **dict.fromkeys(("thread_state", "memory_manager", "get_process_memory", "quantities", "worker_kwargs",
                     "get_data_from_worker", "new_spec")),
    # dask-cuda's
    **dict.fromkeys(("nannies", "cuda_visible_devices")),
    # zarr's
    **dict.fromkeys(("register_ndbuffer",)),
}

def seam(name: str, upstream: str, package: str, checked: tuple[str, ...], serves: str):
    """Register the decorated function as the ``check`` of seam ``name``."""

    def register(check: Callable[[], str | None]) -> Callable[[], str | None]:
        SEAMS[name] = Seam(name, upstream, package, checked, serves, check)
        return check

    return register


_said: set[str] = set()
_said_lock = threading.Lock()


def version_of(package: str) -> str:
    from importlib import metadata

    for name in (package, f"{package}-cu13", f"{package}-cu12"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def off(name: str, why: str) -> bool:
    """Say once per process that seam ``name`` is not usable and what goes without it.
    Returns True the first time (False after)."""
    with _said_lock:
        if name in _said:
            return False
        _said.add(name)
    s = SEAMS[name]
    logger.warning("spillway: %s is off: %s of %s %s %s (spillway was checked against %s)", s.serves, s.upstream,
                   s.package, version_of(s.package), why, ", ".join(s.checked))
    return True


def said_off() -> set[str]:
    """The seams found unusable in this process so far."""
    return set(_said)


def reset() -> None:
    """Forget what was found and said (tests that swap an upstream part, and put it back)."""
    with _said_lock:
        _said.clear()
    expression_types.cache_clear()
    task_spec_types.cache_clear()
    _fusion_blocked.cache_clear()
    _seam_ok.cache_clear()


def usable(name: str) -> bool:
    """Whether seam ``name`` has the shape its adapter expects here; where not (or its
    package is missing, or its check fails), :func:`off` says so once and it is False."""
    try:
        why = SEAMS[name].check()
    except ImportError as e:
        why = f"cannot be imported ({e})"
    except Exception as e:  # noqa: BLE001
        why = f"cannot be read ({type(e).__name__}: {e})"
    if why is None:
        return True
    off(name, why)
    return False


def _source(obj) -> str | None:
    """The source of ``obj``; None where it is not installed with its source (then the
    checks that read it pass: the shape cannot be told, and the feature stays on)."""
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return None


def _reads(obj, text: str) -> bool:
    """Whether the source of ``obj`` has ``text`` (True where it has no source to read)."""
    source = _source(obj)
    return source is None or text in source


def _has_parameters(func, names: tuple[str, ...]) -> str | None:
    try:
        parameters = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return "has no signature to read"
    missing = [n for n in names if n not in parameters]
    return f"has no parameter {', '.join(missing)}" if missing else None


# --- dask: graphs and expressions


@seam("dask_expressions", "dask._expr.Expr, dask._expr.HLGExpr", "dask", DASK, "the capacity check's graph sizes")
def _check_expressions() -> str | None:
    from dask import _expr

    for name in ("Expr", "HLGExpr"):
        if not isinstance(getattr(_expr, name, None), type):
            return f"has no class {name}"
    import dask.array as da
    from dask.base import collections_to_expr

    expr = collections_to_expr([da.ones(2)], True)
    if not isinstance(expr, _expr.Expr) or not isinstance(getattr(expr, "operands", None), list):
        return "a dask array's expression (collections_to_expr) is not an Expr with operands"
    if not isinstance(getattr(expr, "_name", None), str):
        return "an Expr has no _name (its output's key name)"
    return None


@functools.cache
def expression_types() -> tuple[type, type] | None:
    """dask's (Expr, HLGExpr), or None (the capacity check then reads no sizes)."""
    if not usable("dask_expressions"):
        return None
    from dask._expr import Expr, HLGExpr

    return Expr, HLGExpr


def expression_name(expr) -> str | None:
    """The key name of a dask array expression's output, None where it cannot say."""
    name = getattr(expr, "_name", None)
    return name if isinstance(name, str) else None


@seam("dask_task_spec", "dask._task_spec.Alias, Task, TaskRef", "dask", DASK, "the capacity check's graph sizes")
def _check_task_spec() -> str | None:
    from dask import _task_spec

    for name in ("Alias", "Task", "TaskRef"):
        if not isinstance(getattr(_task_spec, name, None), type):
            return f"has no class {name}"
    return None


class _Never:
    """Stands for a task class this dask does not have: nothing is an instance of it."""


@functools.cache
def task_spec_types() -> tuple[type, type, type]:
    """dask's (Alias, Task, TaskRef); where it has no such classes, classes nothing is an
    instance of (the sizes of slices and aliases are then not told)."""
    if not usable("dask_task_spec"):
        return _Never, _Never, _Never
    from dask._task_spec import Alias, Task, TaskRef

    return Alias, Task, TaskRef


# --- distributed's scheduler: the graph as it arrives, and keys failed by a plugin


@seam("materialize_graph", "distributed.scheduler._materialize_graph", "distributed", DISTRIBUTED,
      "the capacity check (graphs run unchecked)")
def _check_materialize() -> str | None:
    import distributed.scheduler as ds

    current = getattr(ds, "_materialize_graph", None)
    if current is None:
        return "is not there"
    return _has_parameters(getattr(current, "_spillway_original", current), ("expr", "validate"))


def wrap_graph_materialization(add: Callable[[Any, Mapping, dict], None]) -> bool:
    """Wrap distributed's ``_materialize_graph`` (once per process, counted) so that
    ``add(expr, dsk, annotations)`` may add annotations to each graph as it arrives. The
    wrapper hands back what distributed's function returned, whatever it is: where that is
    not ``(dsk, annotations)``, or ``add`` fails, the graph goes on as it came. False where
    this distributed has no such function (nothing wrapped)."""
    import distributed.scheduler as ds

    if not usable("materialize_graph"):
        return False
    current = ds._materialize_graph
    if getattr(current, "_spillway_sizes", False):
        current._spillway_users[0] += 1
        return True

    @functools.wraps(current)
    def materialize(*args, **kwargs):
        result = current(*args, **kwargs)
        try:
            if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], Mapping)
                    and isinstance(result[1], dict)):
                off("materialize_graph", f"returned {type(result).__name__}, not (dsk, annotations)")
                return result
            expr = kwargs["expr"] if "expr" in kwargs else args[0]
            add(expr, result[0], result[1])
        except Exception:  # noqa: BLE001 (annotations are a check's input: the graph runs without them)
            logger.debug("no annotations added to a graph", exc_info=True)
        return result

    materialize._spillway_sizes = True
    materialize._spillway_users = [1]
    materialize._spillway_original = current
    ds._materialize_graph = materialize
    return True


def unwrap_graph_materialization() -> None:
    """Undo :func:`wrap_graph_materialization` once its last user is gone."""
    import distributed.scheduler as ds

    current = getattr(ds, "_materialize_graph", None)
    if not getattr(current, "_spillway_sizes", False):
        return
    current._spillway_users[0] -= 1
    if current._spillway_users[0] <= 0:
        ds._materialize_graph = current._spillway_original


@seam("scheduler_fail_keys", "Scheduler.report(task-erred), client_releases_keys, new_task, TaskState.exception*, "
      "client_desires_keys", "distributed", DISTRIBUTED, "erred keys kept after a stop (later graphs on them "
      "fail as lost dependencies instead)")
def _check_fail_keys() -> str | None:
    from distributed.scheduler import Scheduler, TaskState

    for name in ("report", "client_releases_keys", "client_desires_keys", "new_task", "transitions"):
        if not callable(getattr(Scheduler, name, None)):
            return f"Scheduler has no {name}"
    slots = set(getattr(TaskState, "__slots__", ()))
    if slots:
        missing = {"exception", "traceback", "exception_text", "traceback_text", "exception_blame"} - slots
        if missing:
            return f"TaskState has no {', '.join(sorted(missing))}"
    return _has_parameters(Scheduler.client_releases_keys, ("keys", "client", "stimulus_id"))


def fail_keys(scheduler, client: str, keys: list, exception: Exception, stimulus_id: str) -> None:
    """Fail ``keys`` of ``client`` with ``exception`` and release them (nothing of them runs
    on, and what they hold leaves the workers); then keep each as an erred key without data,
    so that what the client builds on them later fails with the same line (not as "lost
    dependencies") until it lets them go. Where the scheduler is not of the shape known,
    the keys are released all the same (their computation stops)."""
    from distributed.core import error_message

    error = error_message(exception)
    try:
        for key in keys:
            scheduler.report({"op": "task-erred", "key": key, "exception": error["exception"],
                              "traceback": None}, client=client)
    except Exception as e:  # noqa: BLE001
        off("scheduler_fail_keys", f"report failed ({type(e).__name__}: {e})")
    scheduler.client_releases_keys(keys=keys, client=client, stimulus_id=stimulus_id)
    # after this tick's transitions (update_graph's own still hold recommendations for
    # these keys, which find them gone)
    scheduler.loop.add_callback(_erred_placeholders, scheduler, client, keys, error, str(exception), stimulus_id)


def _erred_placeholders(scheduler, client, keys, error, text, stimulus_id) -> None:
    if client not in scheduler.clients:
        return
    try:
        made = []
        for key in keys:
            if key in scheduler.tasks:  # wanted by another client, or sent again since
                continue
            ts = scheduler.new_task(key, None, "released")
            ts.exception = error["exception"]
            ts.traceback = None
            ts.exception_text = text
            ts.traceback_text = ""
            ts.exception_blame = ts
            made.append(key)
        if made:
            scheduler.transitions({k: "erred" for k in made}, stimulus_id)
            scheduler.client_desires_keys(keys=made, client=client)
    except Exception as e:  # noqa: BLE001
        off("scheduler_fail_keys", f"an erred key could not be made ({type(e).__name__}: {e})")


@seam("erred_exception_text", "SchedulerPlugin.transition(..., exception_text=, worker=) to erred", "distributed",
      DISTRIBUTED, "the disk-full stop on a task's error (the store's event still stops)")
def _check_exception_text() -> str | None:
    from distributed.scheduler import SchedulerState

    method = getattr(SchedulerState, "_transition_processing_erred", None)
    if method is None:
        return "SchedulerState has no _transition_processing_erred"
    return _has_parameters(method, ("worker", "exception_text"))


def erred_text(transition_kwargs: Mapping) -> tuple[str | None, str | None]:
    """(the exception's text, the worker's address) of a transition to erred, as
    distributed hands them to scheduler plugins (either may be None)."""
    text = transition_kwargs.get("exception_text")
    worker = transition_kwargs.get("worker")
    return (text if isinstance(text, str) else None), (worker if isinstance(worker, str) else None)


@seam("worker_event", "Scheduler.log_worker_event adds msg['worker']", "distributed", DISTRIBUTED,
      "naming the worker whose disk filled (a full disk then stops the newest computation anywhere)")
def _check_worker_event() -> str | None:
    from distributed.scheduler import Scheduler

    return None if _reads(Scheduler.log_worker_event, 'msg["worker"]') else "no longer names the worker in the event"


def event_worker(msg: Any) -> str | None:
    """The worker a worker's event came from (distributed adds it to a dict message)."""
    worker = msg.get("worker") if isinstance(msg, dict) else None
    return worker if isinstance(worker, str) else None


@seam("client_print", "Scheduler.client_send({'op': 'event', 'topic': 'print'}), Client._event_handlers['print'], "
      "distributed.client._handle_print", "distributed", DISTRIBUTED,
      "the disk-traffic line at the client that sent a graph (the scheduler's log and event still say it)")
def _check_client_print() -> str | None:
    import distributed.client
    from distributed import Client
    from distributed.scheduler import Scheduler

    if not callable(getattr(Scheduler, "client_send", None)):
        return "Scheduler has no client_send"
    printer = getattr(distributed.client, "_handle_print", None)
    if printer is None or getattr(Client, "_default_event_handlers", {}).get("print") is not printer:
        return "a Client no longer prints its 'print' events with _handle_print"
    if not _reads(printer, 'msg.get("args")') or not _reads(Client._handle_event, "self._event_handlers[topic]"):
        return "a Client's 'print' event no longer reads the shape spillway sends"
    return None


def print_at_client(scheduler, client: str, line: str, tag: str) -> bool:
    """Print ``line`` at ``client`` alone, as distributed's ``print`` from a task prints at
    every client (a "print" event, sent to that client's comm rather than published to
    the topic's subscribers); ``tag`` marks it for :func:`route_prints`. False where this
    distributed cannot (or the client is gone)."""
    if not usable("client_print") or client not in scheduler.clients:
        return False
    import time

    message = {"args": (line,), "sep": " ", "end": "\n", "flush": True, "spillway": tag}
    try:
        scheduler.client_send(client, {"op": "event", "topic": "print", "event": (time.time(), message)})
    except Exception as e:  # noqa: BLE001
        off("client_print", f"client_send failed ({type(e).__name__}: {e})")
        return False
    return True


def route_prints(client, tag: str, take: Callable[[str], bool]):
    """Hand the lines printed at ``client`` under ``tag`` (:func:`print_at_client`) to
    ``take`` first; those it returns False for, and every other print, print as before.
    Returns what :func:`unroute_prints` puts back (None where nothing was routed)."""
    if not usable("client_print"):
        return None
    handlers = getattr(client, "_event_handlers", None)
    if not isinstance(handlers, dict):
        off("client_print", "a Client has no _event_handlers")
        return None
    previous = handlers.get("print")
    printer = previous
    if printer is None:
        import distributed.client

        printer = distributed.client._handle_print

    def handle(event):
        msg = event[1] if isinstance(event, (tuple, list)) and len(event) == 2 else None
        if isinstance(msg, dict) and msg.get("spillway") == tag and msg.get("args"):
            if take(str(msg["args"][0])):
                return None
        return printer(event)

    # the client is subscribed to "print" from its start: its handler is swapped, no
    # message goes to the scheduler
    handlers["print"] = handle
    return (handle, previous)


def unroute_prints(client, routed) -> None:
    if routed is None:
        return
    handle, previous = routed
    handlers = client._event_handlers
    if handlers.get("print") is handle:
        if previous is None:
            handlers.pop("print", None)
        else:
            handlers["print"] = previous


# --- distributed's worker: gathers, outgoing transfers, its queue and its instances


@seam("get_data_from_worker", "distributed.worker.get_data_from_worker(rpc, keys, worker, *, who, serializers, "
      "deserializers)", "distributed", DISTRIBUTED, "the data plane (gathers go over distributed's comm)")
def _check_get_data() -> str | None:
    import distributed.worker

    current = getattr(distributed.worker, "get_data_from_worker", None)
    if current is None or not inspect.iscoroutinefunction(current):
        return "is not there as a coroutine function"
    why = _has_parameters(current, ("rpc", "keys", "worker", "who", "serializers", "deserializers"))
    if why is not None:
        return why
    if not _reads(distributed.worker.Worker.gather_dep, "get_data_from_worker("):
        return "is no longer called by Worker.gather_dep"
    return None


def route_gathers(routed) -> Callable | None:
    """Route distributed's worker-to-worker gather through ``routed`` (same signature);
    returns distributed's own function, for ``routed`` to fall back on and for
    :func:`unroute_gathers`. None where this distributed gathers otherwise: the data plane
    is off and gathers go over the comm."""
    import distributed.worker

    if not usable("get_data_from_worker"):
        return None
    original = distributed.worker.get_data_from_worker
    distributed.worker.get_data_from_worker = routed
    return original


def unroute_gathers(original) -> None:
    import distributed.worker

    distributed.worker.get_data_from_worker = original


OUTGOING = ("transfer_outgoing_count_limit", "transfer_outgoing_count", "transfer_outgoing_count_total",
            "transfer_outgoing_bytes", "transfer_outgoing_bytes_total", "transfer_outgoing_log")


@seam("transfer_outgoing", "Worker." + ", ".join(OUTGOING), "distributed", DISTRIBUTED,
      "the data plane's send limit and outgoing transfer log (it serves without them)")
def _check_outgoing() -> str | None:
    from distributed import Worker

    annotations = inspect.get_annotations(Worker)
    missing = [n for n in OUTGOING if n not in annotations]
    if missing:
        return f"Worker has no {', '.join(missing)}"
    if not (_reads(Worker.get_data, "get_address_host") and _reads(Worker.get_data, "* 2")):
        return "Worker.get_data no longer doubles the limit for peers of its host"
    return None


def _outgoing_ready(worker) -> bool:
    if all(hasattr(worker, n) for n in OUTGOING):
        return True
    off("transfer_outgoing", "is not on this worker")
    return False


def sending(worker) -> bool:
    """Whether ``worker`` is sending data to a peer now (False where it cannot say)."""
    return bool(getattr(worker, "transfer_outgoing_count", 0)) if _outgoing_ready(worker) else False


def at_work(worker) -> bool:
    """Whether ``worker`` is running a task (executing or seceded) or moving data in or out."""
    state = getattr(worker, "state", None)
    if state is None:
        return False
    return bool(state.executing_count or state.long_running or state.transfer_incoming_count or sending(worker))


def tasks_executing(worker) -> int:
    """How many tasks ``worker`` is executing now (0 where it cannot say)."""
    return int(getattr(getattr(worker, "state", None), "executing_count", 0) or 0)


def outgoing_at_limit(worker, requester: str | None) -> bool:
    """Worker.get_data's rule: a worker sends to at most ``transfer_outgoing_count_limit``
    peers at once, twice that many where the requester is on this worker's host, one
    while it is paused."""
    if not _outgoing_ready(worker):
        return False
    from distributed.comm.addressing import get_address_host

    limit = worker.transfer_outgoing_count_limit
    try:
        if requester and get_address_host(requester) == get_address_host(worker.address):
            limit *= 2
    except Exception:  # noqa: BLE001 (an address of a scheme not registered here: another host)
        pass
    if getattr(getattr(worker, "status", None), "name", None) == "paused":
        limit = 1
    return worker.transfer_outgoing_count >= limit


def outgoing_started(worker) -> None:
    if _outgoing_ready(worker):
        worker.transfer_outgoing_count += 1
        worker.transfer_outgoing_count_total += 1


def outgoing_bytes(worker, nbytes: int) -> None:
    """``nbytes`` more (or fewer, negative) on their way out of ``worker``."""
    if _outgoing_ready(worker):
        worker.transfer_outgoing_bytes += nbytes
        if nbytes > 0:
            worker.transfer_outgoing_bytes_total += nbytes


def outgoing_finished(worker, entry: dict) -> None:
    """One send done: counted off, and ``entry`` in the worker's outgoing transfer log."""
    if _outgoing_ready(worker):
        worker.transfer_outgoing_count -= 1
        worker.transfer_outgoing_log.append(entry)


@seam("worker_queue", "WorkerState.ready.peekn, WorkerState.constrained.peekn", "distributed", DISTRIBUTED,
      "prefetching the inputs of the next tasks to run")
def _check_queue() -> str | None:
    from distributed.worker_state_machine import WorkerState

    state = WorkerState()
    for name in ("ready", "constrained"):
        if not callable(getattr(getattr(state, name, None), "peekn", None)):
            return f"WorkerState.{name} has no peekn"
    return None


def queued_tasks(state, n: int) -> list:
    """The next ``n`` tasks queued to run on a worker (its ready and constrained ones),
    soonest first; none where they cannot be read (the worker's loop changed them while
    they were read: the next look finds them)."""
    try:
        queued = list(state.ready.peekn(n)) + list(state.constrained.peekn(n))
    except RuntimeError:  # changed while iterated, off the event loop
        return []
    except AttributeError as e:
        off("worker_queue", f"cannot be read ({e})")
        return []
    queued.sort(key=lambda ts: ts.priority)
    return queued[:n]


@seam("worker_instances", "distributed.Worker._instances", "distributed", DISTRIBUTED,
      "stopping the pinned arena's growth while its worker closes")
def _check_instances() -> str | None:
    import weakref

    from distributed import Worker

    return None if isinstance(getattr(Worker, "_instances", None), weakref.WeakSet) else "is not a WeakSet"


def workers_of_process() -> list:
    """The workers of this process."""
    from distributed import Worker

    found = getattr(Worker, "_instances", None)
    if found is None:
        off("worker_instances", "is not there")
        return []
    return list(found)


# --- distributed's scheduler state and a worker's: the tasks, workers and clients they keep
#
# Scheduler plugins and worker handlers are handed the scheduler or the worker itself, and
# distributed keeps its books there in classes it documents as internal (SchedulerState,
# TaskState, WorkerState, ClientState, the worker's WorkerState). spillway reads them here
# alone, as plain keys, addresses, states and numbers; a TaskState is handed on as it came
# (a handle for the readers below and :func:`restrict_loosely`), never read elsewhere.

SCHEDULER_STATE = ("tasks", "workers", "running", "clients", "queued", "unrunnable")
SCHEDULER_TASK = ("key", "state", "nbytes", "priority", "dependencies", "dependents", "who_has", "waiters",
                  "run_spec")
SCHEDULER_WORKER = ("address", "nbytes", "metrics", "memory_limit", "has_what", "processing")


def _annotated(cls) -> set[str]:
    """The instance attributes ``cls`` and its bases declare (their annotations)."""
    return set().union(*(inspect.get_annotations(c) for c in cls.__mro__))


def _has_names(cls, names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` that ``cls`` has neither as an attribute (slot, property,
    method) nor as an annotated instance attribute."""
    annotations = _annotated(cls)
    return [n for n in names if not hasattr(cls, n) and n not in annotations]


@seam("scheduler_state", "SchedulerState." + ", .".join(SCHEDULER_STATE) + "; Scheduler.transitions; TaskState."
      + ", .".join(SCHEDULER_TASK) + "; WorkerState." + ", .".join(SCHEDULER_WORKER) + "; ClientState.wants_what",
      "distributed", DISTRIBUTED, "what spillway's scheduler plugins read of the scheduler's tasks and workers (the "
      "capacity check, the run's progress, the collective's placement, the next-use ranks and the worker-loss "
      "check read nothing there)")
def _check_scheduler_state() -> str | None:
    from distributed.scheduler import ClientState, Scheduler, SchedulerState, TaskState, WorkerState

    for cls, names in ((SchedulerState, SCHEDULER_STATE), (Scheduler, ("transitions",)), (TaskState, SCHEDULER_TASK),
                       (WorkerState, SCHEDULER_WORKER), (ClientState, ("wants_what",))):
        missing = _has_names(cls, names)
        if missing:
            return f"{cls.__name__} has no {', '.join(missing)}"
    return None


def _read(obj, name: str, seam_name: str, default):
    """``obj.name``; where it has no such attribute, ``default`` (and the seam is off)."""
    try:
        return getattr(obj, name)
    except AttributeError:
        off(seam_name, f"{type(obj).__name__} has no {name}")
        return default


def scheduler_task(scheduler, key):
    """The scheduler's task of ``key`` (a handle for the readers below), None where it has none."""
    return _read(scheduler, "tasks", "scheduler_state", {}).get(key)


def key_state(scheduler, key) -> str | None:
    """The scheduler's state of ``key`` ("released", "memory", ...), None where it has no such task."""
    ts = scheduler_task(scheduler, key)
    return None if ts is None else task_state(ts)


def key_nbytes(scheduler, key) -> int:
    """The bytes of ``key``'s value as the scheduler knows them, 0 where not known."""
    ts = scheduler_task(scheduler, key)
    return 0 if ts is None else task_nbytes(ts)


def task_key(ts):
    return ts.key


def task_state(ts) -> str | None:
    """A task's state, of the scheduler's or a worker's (None where it has none)."""
    return _read(ts, "state", "scheduler_state", None)


def task_nbytes(ts) -> int:
    """A task's bytes, of the scheduler's or a worker's (0 where not known)."""
    nbytes = _read(ts, "nbytes", "scheduler_state", 0) or 0
    return max(int(nbytes), 0)


def task_priority(ts):
    """A task's priority (dask's tuple: smaller runs sooner), None where it has none."""
    return _read(ts, "priority", "scheduler_state", None)


def task_dependencies(ts) -> list:
    """The tasks ``ts`` reads (handles, of the scheduler's or the worker's own)."""
    return list(_read(ts, "dependencies", "scheduler_state", ()))


def task_dependents(ts) -> list:
    """The tasks that read ``ts`` (handles, of the scheduler's or the worker's own)."""
    return list(_read(ts, "dependents", "scheduler_state", ()))


def task_holders(ts) -> set[str]:
    """The addresses of the workers that hold the scheduler's task ``ts``'s value."""
    return {ws.address for ws in (_read(ts, "who_has", "scheduler_state", None) or ())}


def dependency_holders(ts) -> set[str]:
    """The addresses of the workers that hold a value the scheduler's task ``ts`` reads."""
    return set().union(*(task_holders(dts) for dts in task_dependencies(ts)))


def dependency_keys(scheduler, key) -> list:
    """The keys ``key``'s task reads, [] where the scheduler has no such task."""
    ts = scheduler_task(scheduler, key)
    return [] if ts is None else [task_key(d) for d in task_dependencies(ts)]


def dependent_keys(scheduler, key) -> list:
    """The keys of the tasks that read ``key``, [] where the scheduler has no such task."""
    ts = scheduler_task(scheduler, key)
    return [] if ts is None else [task_key(d) for d in task_dependents(ts)]


def scheduler_keys(scheduler) -> list:
    """Every key the scheduler has a task of."""
    return list(_read(scheduler, "tasks", "scheduler_state", {}))


def recommend(scheduler, recommendations: dict, stimulus_id: str) -> None:
    """The scheduler's tasks moved as ``recommendations`` (key -> state) say, and what
    follows from that (``SchedulerState.transitions``)."""
    if recommendations:
        _read(scheduler, "transitions", "scheduler_state", lambda *a, **k: None)(recommendations,
                                                                                 stimulus_id=stimulus_id)


def alias_target(scheduler, key):
    """The key that ``key``'s task stands for where it is dask's Alias of another, else None."""
    ts = scheduler_task(scheduler, key)
    spec = None if ts is None else getattr(ts, "run_spec", None)
    return spec.target if isinstance(spec, task_spec_types()[0]) else None


def _workers(scheduler, running: bool) -> list:
    if running:
        return list(_read(scheduler, "running", "scheduler_state", ()))
    return list(_read(scheduler, "workers", "scheduler_state", {}).values())


def worker_addresses(scheduler, running: bool = False) -> list[str]:
    """The addresses of the scheduler's workers (its running ones alone with ``running``)."""
    return [ws.address for ws in _workers(scheduler, running)]


def has_worker(scheduler, address) -> bool:
    return address in _read(scheduler, "workers", "scheduler_state", {})


def worker_metric(scheduler, name: str, running: bool = False) -> dict:
    """Each worker's last value of its metric ``name`` (``Worker.metrics``, sent with its
    heartbeats) by address; None for a worker that sent none."""
    return {ws.address: (getattr(ws, "metrics", None) or {}).get(name) for ws in _workers(scheduler, running)}


def worker_memory_limits(scheduler, running: bool = False) -> dict:
    """Each worker's memory limit by address (0 where it has none)."""
    return {ws.address: int(getattr(ws, "memory_limit", 0) or 0) for ws in _workers(scheduler, running)}


def held_bytes(scheduler) -> int:
    """The bytes of the values the scheduler's workers hold."""
    return sum(int(getattr(ws, "nbytes", 0) or 0) for ws in _workers(scheduler, False))


def keys_on_worker(scheduler, address) -> set:
    """The keys worker ``address`` holds, runs or will run (none where it is not there)."""
    ws = _read(scheduler, "workers", "scheduler_state", {}).get(address) if address else None
    if ws is None:
        return set()
    return {task_key(ts) for ts in ws.has_what} | {task_key(ts) for ts in ws.processing}


def waiting_priorities(scheduler, address) -> tuple[list, list]:
    """(keys, priorities): for each key worker ``address`` holds, the soonest priority of
    the tasks still waiting for it anywhere (None where none waits)."""
    ws = _read(scheduler, "workers", "scheduler_state", {}).get(address)
    keys, priorities = [], []
    if ws is None:
        return keys, priorities
    for ts in list(ws.has_what):
        keys.append(ts.key)
        priorities.append(min((w.priority for w in ts.waiters or () if w.priority is not None), default=None))
    return keys, priorities


def scheduler_busy(scheduler) -> bool:
    """Whether ``scheduler`` has a task queued or running on a worker."""
    if getattr(scheduler, "queued", None) or getattr(scheduler, "unrunnable", None):
        return True
    return any(ws.processing for ws in getattr(scheduler, "workers", {}).values())


def client_known(scheduler, client: str) -> bool:
    """Whether the scheduler has client ``client`` (connected, or holding keys)."""
    return client in _read(scheduler, "clients", "scheduler_state", {})


def client_wanted_keys(scheduler, client: str) -> list | None:
    """The keys client ``client`` waits for, None where the scheduler has no such client."""
    state = _read(scheduler, "clients", "scheduler_state", {}).get(client)
    return None if state is None else [task_key(ts) for ts in state.wants_what]


WORKER_STATE = ("tasks", "executing", "long_running")
WORKER_TASK = ("key", "state", "nbytes", "priority", "dependencies", "dependents")
#: the worker task states of a task that will still read its inputs on that worker
WORKER_PENDING = frozenset({"waiting", "ready", "constrained", "executing", "long-running"})


@seam("worker_state", "Worker.state: WorkerState." + ", .".join(WORKER_STATE) + "; TaskState."
      + ", .".join(WORKER_TASK), "distributed", DISTRIBUTED, "what the worker's store and data plane read "
      "of the worker's tasks (the store's ranks by next use and its running tasks' inputs, a gather's sizes)")
def _check_worker_state() -> str | None:
    from distributed import Worker
    from distributed.worker_state_machine import TaskState, WorkerState

    if _has_names(Worker, ("state",)):
        return "Worker has no state"
    for cls, names in ((WorkerState, WORKER_STATE), (TaskState, WORKER_TASK)):
        missing = _has_names(cls, names)
        if missing:
            return f"{cls.__name__} has no {', '.join(missing)}"
    if not WORKER_PENDING <= set(_worker_task_states()):
        return "a worker's task is no longer waiting, ready, constrained, executing or long-running"
    return None


def _worker_task_states() -> tuple:
    import typing

    from distributed import worker_state_machine

    return typing.get_args(getattr(worker_state_machine, "TaskStateState", None)) or tuple(WORKER_PENDING)


def _worker_tasks(worker) -> Mapping:
    state = _read(worker, "state", "worker_state", None)
    return {} if state is None else _read(state, "tasks", "worker_state", {})


def worker_task(worker, key):
    """The worker's own task of ``key`` (a handle), None where it has none."""
    return _worker_tasks(worker).get(key)


def worker_key_nbytes(worker, key) -> int:
    """The bytes of ``key``'s value as the worker knows them, 0 where not known."""
    ts = worker_task(worker, key)
    return 0 if ts is None else task_nbytes(ts)


def local_readers_rank(worker) -> Callable[[Any], Any]:
    """``rank(key)``: the soonest priority among the tasks on ``worker`` that still read
    ``key`` (waiting, ready or running there), None where none does. Called from the
    store's threads while the worker's event loop changes the tasks: a look that finds
    them changed under it says None."""
    tasks = _worker_tasks(worker)

    def rank(key):
        try:
            ts = tasks.get(key)
            if ts is None:
                return None
            return min((d.priority for d in ts.dependents if d.state in WORKER_PENDING), default=None)
        except RuntimeError:  # the event loop changed the task graph while we looked
            return None

    return rank


def keys_in_use(worker) -> set:
    """The keys of the tasks running on ``worker`` (executing or seceded) and of the values they read."""
    state = _read(worker, "state", "worker_state", None)
    keys = set()
    if state is None:
        return keys
    for ts in list(state.executing) + list(state.long_running):
        keys.add(ts.key)
        keys.update(dep.key for dep in ts.dependencies)
    return keys


def queued_inputs(worker, n_tasks: int) -> list:
    """The keys the next ``n_tasks`` tasks queued on ``worker`` read, soonest first, each once."""
    state = _read(worker, "state", "worker_state", None)
    seen, out = set(), []
    for ts in ([] if state is None else queued_tasks(state, n_tasks)):
        for dep in ts.dependencies:
            if dep.key not in seen:
                seen.add(dep.key)
                out.append(dep.key)
    return out


def transfer_entry(worker, who: str, keys: dict, total: int, start: float, stop: float) -> dict:
    """An entry of a worker's transfer log (incoming or outgoing) as distributed writes its
    own: times on the scheduler's clock, ``keys`` by their bytes."""
    delay = getattr(worker, "scheduler_delay", 0.0) or 0.0
    return {"start": start + delay, "stop": stop + delay, "middle": (start + stop) / 2 + delay,
            "duration": stop - start, "who": who, "keys": keys, "total": total, "compressed": None,
            "bandwidth": total / max(stop - start, 1e-6)}


def incoming_log(worker) -> list:
    """The worker's incoming transfer log (its entries as distributed writes them)."""
    return list(getattr(worker, "transfer_incoming_log", ()))


@seam("worker_monitor", "Worker.monitor (SystemMonitor.quantities['time'], ['memory'], get_process_memory), "
      "Worker.memory_manager.memory_limit", "distributed", DISTRIBUTED,
      "a worker's host memory peak in the run report and its host limit in the tiers it reports (they read 0)")
def _check_worker_monitor() -> str | None:
    from distributed import Worker
    from distributed.system_monitor import SystemMonitor
    from distributed.worker_memory import WorkerMemoryManager

    missing = _has_names(Worker, ("monitor", "memory_manager")) + _has_names(SystemMonitor, (
        "quantities", "get_process_memory")) + _has_names(WorkerMemoryManager, ("memory_limit",))
    if missing:
        return f"has no {', '.join(missing)}"
    if not _reads(SystemMonitor.__init__, '"memory"') or not _reads(SystemMonitor.__init__, '"time"'):
        return "SystemMonitor no longer records time and memory"
    return None


def process_memory(worker, since: float) -> tuple[int, int]:
    """(peak, current) resident bytes of ``worker``'s process since ``since`` (a time.time()),
    as distributed's monitor samples them; (0, 0) where it cannot say."""
    monitor = getattr(worker, "monitor", None)
    try:
        quantities = monitor.quantities
        samples = [m for t, m in zip(quantities["time"], quantities["memory"]) if t >= since]
        rss = int(monitor.get_process_memory())
    except (AttributeError, KeyError, TypeError) as e:
        off("worker_monitor", f"cannot be read ({type(e).__name__}: {e})")
        return 0, 0
    return int(max(samples + [rss])), rss


def worker_memory_limit(worker) -> int:
    """``worker``'s memory limit (bytes; 0 where it has none)."""
    manager = getattr(worker, "memory_manager", None)
    if manager is None:
        off("worker_monitor", f"{type(worker).__name__} has no memory_manager")
        return 0
    return int(getattr(manager, "memory_limit", 0) or 0)


@seam("worker_threads", "distributed.threadpoolexecutor.thread_state (.executor, .proceed), "
      "ThreadPoolExecutor._threads", "distributed", DISTRIBUTED,
      "a Zarr read's task seceding while the read pool works for it (it holds its worker thread)")
def _check_worker_threads() -> str | None:
    from distributed import threadpoolexecutor as tpe

    if not isinstance(getattr(tpe, "thread_state", None), threading.local):
        return "has no thread_state"
    if not _reads(tpe._worker, "thread_state.executor = executor") or not _reads(tpe._worker, "thread_state.proceed"):
        return "a pool's thread no longer keeps its executor and proceed in thread_state"
    if not _reads(tpe.secede, "thread_state.executor._threads.remove"):
        return "secede no longer takes its thread out of the executor's _threads"
    return None


@functools.cache
def _seam_ok(name: str) -> bool:
    """:func:`usable`, once per process (for adapters on a hot path; :func:`reset` forgets it)."""
    return usable(name)


def in_task_thread() -> bool:
    """Whether this thread runs a task in a dask worker's thread pool and has not seceded
    (it may secede). False where this distributed keeps its threads otherwise."""
    try:
        from distributed.threadpoolexecutor import thread_state
    except ImportError:
        return False
    executor = getattr(thread_state, "executor", None)
    if executor is None or not getattr(thread_state, "proceed", False) or not _seam_ok("worker_threads"):
        return False
    return threading.current_thread() in getattr(executor, "_threads", ())


# --- the collective rechunk (spillway.datapath.collective)


@seam("rechunk_p2p", "distributed.shuffle.rechunk_p2p (as dask.array.rechunk calls it)", "distributed",
      DISTRIBUTED, "users' own rechunks on the collective (they take dask's task-based or P2P method)")
def _check_rechunk_p2p() -> str | None:
    import importlib

    import distributed.shuffle

    rechunks = importlib.import_module("dask.array.rechunk")  # dask.array.rechunk is also the function

    current = getattr(distributed.shuffle, "rechunk_p2p", None)
    if current is None:
        return "is not there"
    why = _has_parameters(current, ("x", "chunks", "threshold", "block_size_limit", "balance"))
    if why is not None:
        return why
    if not _reads(rechunks.rechunk, "from distributed.shuffle import rechunk_p2p"):
        return "dask.array.rechunk no longer looks it up at each call"
    return None


@seam("overlap_internal", "dask.array.overlap.overlap_internal (as dask.array.overlap.overlap calls it)", "dask",
      DASK, "users' own map_overlap halos as one exchange (they take dask's task a face, edge and corner)")
def _check_overlap_internal() -> str | None:
    import dask.array.overlap as overlaps

    current = getattr(overlaps, "overlap_internal", None)
    if current is None:
        return "is not there"
    why = _has_parameters(current, ("x", "axes"))
    if why is not None:
        return why
    if not _reads(overlaps.overlap, "overlap_internal("):
        return "dask.array.overlap.overlap no longer calls it by its module's name"
    return None


#: what a seam's route replaces: the module dask or distributed looks the name up in at each
#: call, and the name
ROUTES = {"rechunk_p2p": ("distributed.shuffle", "rechunk_p2p"),
          "overlap_internal": ("dask.array.overlap", "overlap_internal")}


def route(name: str, routed) -> Callable | None:
    """Make ``routed`` what upstream calls through seam ``name`` (:data:`ROUTES`): dask's P2P
    rechunk, or the ``overlap_internal`` that ``overlap`` and ``map_overlap`` call. Returns
    upstream's own (for ``routed`` to hand other clusters' calls to, and to put back), or
    None where this dask and distributed do not meet there."""
    import importlib

    if not usable(name):
        return None
    module, attribute = ROUTES[name]
    module = importlib.import_module(module)
    original = getattr(module, attribute)
    setattr(module, attribute, routed)
    return original


def unroute(name: str, original) -> None:
    import importlib

    module, attribute = ROUTES[name]
    setattr(importlib.import_module(module), attribute, original)


TASK_STATE = ("worker_restrictions", "loose_restrictions", "run_spec", "dependents", "dependencies", "priority",
              "who_has")


@seam("task_restrictions", "distributed.scheduler.TaskState." + ", .".join(TASK_STATE), "distributed",
      DISTRIBUTED, "placing a rechunk's assemblies on the workers their pieces went to, and binding an "
      "exchange's steps to workers of their own (they run where dask puts them: assemblies are handed their "
      "pieces, steps on one worker share its threads)")
def _check_task_state() -> str | None:
    from distributed.scheduler import TaskState

    names = set(getattr(TaskState, "__slots__", ())) | set(inspect.get_annotations(TaskState))
    missing = [n for n in TASK_STATE if n not in names]
    return f"TaskState has no {', '.join(missing)}" if missing else None


def restrict_loosely(ts, address: str) -> None:
    """What ``Scheduler.set_restrictions`` and dask's ``allow_other_workers`` annotation set:
    ``ts`` runs on ``address`` while it is there, elsewhere once it is not."""
    if usable("task_restrictions"):
        ts.worker_restrictions = {address}
        ts.loose_restrictions = True


def restrict_strictly(ts, address: str) -> None:
    """What ``Scheduler.set_restrictions`` sets: ``ts`` runs on ``address`` alone (an
    exchange's step, bound to its worker; the plugin binds it anew if the worker leaves)."""
    if usable("task_restrictions"):
        ts.worker_restrictions = {address}
        ts.loose_restrictions = False


def run_args(ts) -> tuple:
    """The arguments ``ts``'s function is called with, as its task holds them (literals as
    they are; () where its run spec is not a task of dask's spec)."""
    try:
        return tuple(ts.run_spec.args)
    except (AttributeError, TypeError):
        return ()


def fused_keys(ts) -> list:
    """The keys of the tasks dask fused into ``ts`` (``Task.fuse`` keeps them in its first
    argument), [] for a task of its own."""
    try:
        return list(ts.run_spec.args[0])
    except (AttributeError, IndexError, TypeError):
        return []


@seam("block_fusion", "dask._task_spec.Task, TaskRef, fuse_linear_task_spec (as it reads GraphNode.block_fusion)",
      "dask", DASK, "the collective's barriers and assemblies kept whole through dask's low-level fusion "
      "(fused into the tasks around them under other keys, which graphs computed in a row trip the scheduler on)")
def _check_block_fusion() -> str | None:
    from dask import _task_spec

    for name in ("Task", "TaskRef"):
        if not isinstance(getattr(_task_spec, name, None), type):
            return f"has no class {name}"
    fuse = getattr(_task_spec, "fuse_linear_task_spec", None)
    if fuse is None:
        return "has no fuse_linear_task_spec"
    # a chain of three with an unfused task in the middle: a fusion that does not read
    # block_fusion makes one task of all three, under a key of its own
    Task, TaskRef = _task_spec.Task, _task_spec.TaskRef
    chain = {"a": Task("a", int), "b": _unfused_type()("b", int, TaskRef("a")), "c": Task("c", int, TaskRef("b"))}
    if fuse(chain, ["c"]).get("b") is not chain["b"]:
        return "fuse_linear_task_spec fuses a task whose block_fusion is True"
    return None


@functools.cache
def _unfused_type() -> type:
    from dask._task_spec import Task

    class UnfusedTask(Task):
        __slots__ = ()

        @property
        def block_fusion(self) -> bool:
            return True

    # pickled by reference, as a task sent to the scheduler and the workers is: each
    # process finds the class under this name (:func:`__getattr__` makes it there)
    UnfusedTask.__module__, UnfusedTask.__qualname__ = __name__, "UnfusedTask"
    globals()["UnfusedTask"] = UnfusedTask
    return UnfusedTask


def __getattr__(name: str):
    if name == "UnfusedTask":
        return _unfused_type()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _fusion_blocked() -> bool:
    return usable("block_fusion")


def unfused_task(key, func, *args):
    """The task ``key`` of ``func(*args)``, kept whole and under its own key by dask's
    low-level fusion; ``args`` name the tasks it reads with :func:`task_ref`. Where this
    dask cannot keep it whole, the plain task tuple (which fusion takes as any other)."""
    if not _fusion_blocked():
        return (func, *args)
    return _unfused_type()(key, func, *args)


def task_ref(key):
    """An :func:`unfused_task`'s argument that reads task ``key``'s result."""
    if not _fusion_blocked():
        return key
    from dask._task_spec import TaskRef

    return TaskRef(key)


@seam("transfer_incoming_log", "Worker.transfer_incoming_log, Worker.scheduler_delay", "distributed",
      DISTRIBUTED, "the collective's moves in the workers' incoming transfer log (the bench's bytes moved)")
def _check_incoming_log() -> str | None:
    from distributed import Worker

    annotations = inspect.get_annotations(Worker)
    missing = [n for n in ("transfer_incoming_log", "scheduler_delay") if n not in annotations]
    return f"Worker has no {', '.join(missing)}" if missing else None


def log_incoming(worker, holder: str, sizes: dict, start: float, stop: float) -> None:
    """A move from ``holder`` in ``worker``'s incoming transfer log, as a gather's entry."""
    if not usable("transfer_incoming_log"):
        return
    worker.transfer_incoming_log.append(transfer_entry(worker, holder, sizes, sum(sizes.values()), start, stop))


# --- distributed's cluster managers


@seam("cluster_adaptive", "Cluster._adaptive", "distributed", DISTRIBUTED,
      "ending adaptive scaling when a fixed size is asked for")
def _check_adaptive() -> str | None:
    from distributed.deploy.cluster import Cluster

    return None if _reads(Cluster.adapt, "self._adaptive") else "Cluster.adapt no longer keeps it"


def adaptive_of(cluster):
    """The cluster's Adaptive while it runs, else None."""
    adaptive = getattr(cluster, "_adaptive", None)
    return adaptive if getattr(adaptive, "state", None) in ("starting", "running") else None


def end_adapting(cluster) -> None:
    adaptive = getattr(cluster, "_adaptive", None)
    if adaptive is not None:
        adaptive.stop()
        cluster._adaptive = None


@seam("spec_scale_down", "SpecCluster.scale_down(workers), SpecCluster.new_spec", "distributed", DISTRIBUTED,
      "closing the very workers retired on scale-down (SpecCluster's own choice otherwise), and later workers' config")
def _check_spec_cluster() -> str | None:
    from distributed.deploy.spec import SpecCluster

    if not inspect.iscoroutinefunction(getattr(SpecCluster, "scale_down", None)):
        return "SpecCluster.scale_down is not a coroutine function"
    if not _reads(SpecCluster.__init__, "self.new_spec"):
        return "SpecCluster keeps no new_spec"
    return _has_parameters(SpecCluster.scale_down, ("workers",))


def close_spec_workers(cluster, names: list) -> None:
    """Close these entries of a SpecCluster's worker spec (after their data was handed on);
    where the cluster has no ``scale_down`` of the shape known, it scales to as many
    entries fewer and picks them itself."""
    scale_down = getattr(cluster, "scale_down", None)
    if scale_down is not None and inspect.iscoroutinefunction(scale_down):
        cluster.sync(scale_down, names)
        return
    off("spec_scale_down", "is not there")
    cluster.scale(max(0, len(cluster.worker_spec) - len(names)))


def new_worker_options(cluster) -> dict | None:
    """The options each new worker of a SpecCluster is made with (a dict to update), or
    None where the cluster keeps none."""
    spec = getattr(cluster, "new_spec", None)
    options = spec.get("options") if isinstance(spec, dict) else None
    if not isinstance(options, dict):
        off("spec_scale_down", "has no new_spec['options']")
        return None
    return options


@seam("spec_correct_state", "SpecCluster._correct_state", "distributed", DISTRIBUTED,
      "waiting, on scale, until each job's submission has been answered (refusals are then told on "
      "the next scale or wait instead)")
def _check_correct_state() -> str | None:
    from distributed.deploy.spec import SpecCluster

    if not callable(getattr(SpecCluster, "_correct_state", None)):
        return "is not there"
    if not _reads(SpecCluster._correct_state, "_correct_state_internal"):
        return "no longer starts _correct_state_internal (what brings the workers to the spec)"
    return None


def bring_to_spec(cluster) -> None:
    """Start or stop a SpecCluster's workers to match its worker spec, and wait until it
    has (each new job's submission answered); where this distributed has no such step,
    the cluster brings them there by itself, later."""
    if not usable("spec_correct_state"):
        return
    cluster.sync(cluster._correct_state)


@seam("nanny_background_tasks", "Server._ongoing_background_tasks.call_soon, AsyncTaskGroupClosedError",
      "distributed", DISTRIBUTED, "a worker's death reason told to the scheduler from its nanny's tasks "
      "(it is told from the nanny's event loop instead, and not cancelled with the nanny)")
def _check_background_tasks() -> str | None:
    from distributed.core import AsyncTaskGroup, AsyncTaskGroupClosedError, Server  # noqa: F401

    if not callable(getattr(AsyncTaskGroup, "call_soon", None)):
        return "AsyncTaskGroup has no call_soon"
    if not _reads(Server.__init__, "self._ongoing_background_tasks = AsyncTaskGroup()"):
        return "Server keeps no _ongoing_background_tasks task group"
    return None


def call_soon_on(server, afunc, *args) -> bool:
    """Run ``afunc(*args)`` on ``server``'s (a nanny's, a worker's) event loop among its
    background tasks, which its close cancels; False where the server is closing (the
    task would be cancelled at once, so it does not start)."""
    if not usable("nanny_background_tasks"):
        server.loop.add_callback(afunc, *args)
        return True
    from distributed.core import AsyncTaskGroupClosedError

    group = getattr(server, "_ongoing_background_tasks", None)
    if group is None:
        off("nanny_background_tasks", f"is not on {type(server).__name__}")
        server.loop.add_callback(afunc, *args)
        return True
    try:
        group.call_soon(afunc, *args)
    except AsyncTaskGroupClosedError:
        return False
    return True


@seam("spec_cluster_start", "SpecCluster._start, SpecCluster.scheduler_spec", "distributed", DISTRIBUTED,
      "a scheduler without an HTTP server where the dashboard is off (it serves one)")
def _check_spec_start() -> str | None:
    from distributed.deploy.spec import SpecCluster

    if not inspect.iscoroutinefunction(getattr(SpecCluster, "_start", None)):
        return "is not a coroutine function"
    if not _reads(SpecCluster._start, "self.scheduler_spec"):
        return "SpecCluster._start no longer reads scheduler_spec"
    return None


def with_scheduler_class(base: type, scheduler_class: Callable[[], type],
                         worker_class: Callable[[], type] | None = None) -> type:
    """``base`` (a SpecCluster) whose scheduler is made of ``scheduler_class()`` and, where
    ``worker_class`` is given, whose nannies start their worker processes as
    ``worker_class()`` (Nanny's own ``worker_class``); ``base`` itself where SpecCluster
    starts otherwise."""
    if not usable("spec_cluster_start"):
        return base

    async def _start(self):
        spec = self.scheduler_spec
        if spec is not None and self.scheduler is None:
            self.scheduler_spec = {**spec, "cls": scheduler_class()}
        if worker_class is not None:
            # before the first workers are made (SpecCluster makes them after _start), and
            # in the spec of later ones
            from distributed import Nanny

            for worker in [*self.worker_spec.values(), getattr(self, "new_spec", None)]:
                cls = worker.get("cls") if isinstance(worker, dict) else None
                if isinstance(cls, type) and issubclass(cls, Nanny) and isinstance(worker.get("options"), dict):
                    worker["options"]["worker_class"] = worker_class()
        await base._start(self)

    return type(base.__name__, (base,), {"_start": _start, "__module__": base.__module__})


@seam("spec_cluster_lost_worker", "SpecCluster._update_worker_status, SpecCluster._futures, "
      "Cluster._update_worker_status", "distributed", DISTRIBUTED,
      "a local worker kept while its nanny brings it back past distributed.deploy.lost-worker-timeout "
      "(its nanny is closed then, and the cluster left a worker short)")
def _check_lost_worker() -> str | None:
    from distributed.deploy.cluster import Cluster
    from distributed.deploy.spec import SpecCluster

    method = SpecCluster._update_worker_status
    why = _has_parameters(method, ("op", "msg")) or _has_parameters(Cluster._update_worker_status, ("op", "msg"))
    if why:
        return why
    for text in ("lost-worker-timeout", "self._futures.add", "del self.workers[name]",
                 'self.scheduler_info["workers"][msg]["name"]', "super()._update_worker_status(op, msg)"):
        if not _reads(method, text):
            return f"SpecCluster._update_worker_status no longer reads {text}"
    return None


_keeping: dict[type, type] = {}


def keeping_restarted_workers(base: type) -> type:
    """``base`` (a SpecCluster of nannies) that keeps a worker's nanny while the nanny is
    bringing its worker back: distributed closes the nanny of a worker that has not come
    back within ``distributed.deploy.lost-worker-timeout`` (15 s, meant for batch jobs
    that are gone), so a restart slower than that on a loaded machine leaves the cluster a
    worker short for good. A nanny that is not starting or running its worker then is
    closed as distributed does; one that is, is looked at again after as long. ``base``
    itself where SpecCluster handles lost workers otherwise."""
    if base in _keeping:
        return _keeping[base]
    from distributed.deploy.cluster import Cluster
    from distributed.deploy.spec import SpecCluster

    if not usable("spec_cluster_lost_worker"):
        return base
    if base._update_worker_status is not SpecCluster._update_worker_status:
        off("spec_cluster_lost_worker", f"{base.__name__} handles lost workers itself")
        return base

    def _update_worker_status(self, op, msg):
        if op != "remove":
            return SpecCluster._update_worker_status(self, op, msg)
        import dask.config
        from dask.utils import parse_timedelta

        name = self.scheduler_info["workers"][msg]["name"]
        delay = parse_timedelta(dask.config.get("distributed.deploy.lost-worker-timeout"))
        loop = asyncio.get_running_loop()

        def look():
            if name not in self.workers or any(d["name"] == name for d in self.scheduler_info["workers"].values()):
                return
            if bringing_back(self.workers[name]) and self.status.name == "running":
                loop.call_later(delay, look)
                return
            self._futures.add(asyncio.ensure_future(self.workers[name].close()))
            del self.workers[name]

        loop.call_later(delay, look)
        Cluster._update_worker_status(self, op, msg)

    _keeping[base] = type(base.__name__, (base,), {"_update_worker_status": _update_worker_status,
                                                   "__module__": base.__module__})
    return _keeping[base]


def bringing_back(nanny) -> bool:
    """Whether ``nanny`` (distributed's Nanny) is running and starting or running its
    worker's process: a worker it lost is on its way back."""
    from distributed.core import Status

    process = getattr(nanny, "process", None)
    return (getattr(nanny, "status", None) == Status.running and process is not None
            and getattr(process, "status", None) in (Status.starting, Status.running))


@seam("process_interface_start", "ProcessInterface.lock, ProcessInterface.__await__", "distributed", DISTRIBUTED,
      "starting a cluster's job under distributed's own lock (under a lock of spillway's instead)")
def _check_process_interface() -> str | None:
    from distributed.deploy.spec import ProcessInterface

    if not _reads(ProcessInterface.__init__, "self.lock = asyncio.Lock()"):
        return "ProcessInterface keeps no asyncio lock as lock"
    if not _reads(ProcessInterface.__await__, "async with self.lock"):
        return "ProcessInterface.__await__ no longer starts it under self.lock"
    return None


_start_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def start_once(process):
    """``await process`` for a ProcessInterface (a cluster's job) whose start may leave it
    failed: started once while created, under the lock distributed's ``__await__`` takes
    (so the two never start it twice), but without its assertion that the start left it
    running. Returns the awaitable that SpecCluster awaits."""
    from distributed.core import Status

    lock = getattr(process, "lock", None) if usable("process_interface_start") else None
    if not isinstance(lock, asyncio.Lock):
        off("process_interface_start", "has no asyncio lock on this job")
        lock = _start_locks.setdefault(process, asyncio.Lock())

    async def start():
        async with lock:
            if process.status == Status.created:
                await process.start()
        return process

    return start().__await__()


# --- distributed's comm and system


@seam("offload_threshold", "distributed.comm.utils.OFFLOAD_THRESHOLD", "distributed", DISTRIBUTED,
      "transfer-offload on workers started by a nanny or MPI (they keep distributed's default)")
def _check_offload() -> str | None:
    from distributed.comm import utils

    if not hasattr(utils, "OFFLOAD_THRESHOLD"):
        return "is not there"
    return None if _reads(utils.to_frames, "OFFLOAD_THRESHOLD") else "is no longer read by to_frames"


def set_offload_threshold(value) -> int | bool | None:
    """Set this process's offload threshold (bytes, or a size string, or False); returns it."""
    from dask.utils import parse_bytes
    from distributed.comm import utils

    if not hasattr(utils, "OFFLOAD_THRESHOLD"):
        off("offload_threshold", "is not there")
        return None
    utils.OFFLOAD_THRESHOLD = parse_bytes(value) if isinstance(value, str) else value
    return utils.OFFLOAD_THRESHOLD


def offload_threshold():
    from distributed.comm import utils

    return getattr(utils, "OFFLOAD_THRESHOLD", None)


@seam("system_module", "distributed/system.py loaded alone (memory_limit)", "distributed", DISTRIBUTED,
      "a quick refusal before start (distributed is imported instead, about a second)")
def _check_system() -> str | None:
    module = _load_system()
    return None if callable(getattr(module, "memory_limit", None)) else "has no memory_limit"


def _load_system():
    import importlib.util
    import sys
    from pathlib import Path

    loaded = sys.modules.get("distributed.system")
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("distributed")  # finds it, imports nothing
    path = Path(package.origin).with_name("system.py")
    spec = importlib.util.spec_from_file_location("spillway._distributed_system", path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def system_memory_limit() -> int:
    """distributed's reading of this host's memory limit (``distributed.system.memory_limit``:
    the machine, its cgroup's limits, ``RLIMIT_RSS``), read without importing the
    distributed package: ``distributed/system.py`` imports nothing of distributed, so it is
    loaded alone from the installed package (the imported module where there is one).
    Where that fails, distributed is imported."""
    try:
        return int(_load_system().memory_limit())
    except Exception as e:  # noqa: BLE001
        off("system_module", f"cannot be loaded alone ({type(e).__name__}: {e})")
        from distributed.system import memory_limit

        return int(memory_limit())


# --- distributed-ucxx and ucxx


@seam("ucx_init_once", "distributed_ucxx.ucxx.init_once", "distributed-ucxx", UCXX,
      "starting UCX before a GPU worker's store (its listener starts it later, with a warning), and "
      "the client's UCX without CUDA IPC (a closed cluster's RMM pools stay mapped in the client's process)")
def _check_init_once() -> str | None:
    from distributed_ucxx import ucxx as ducxx

    return None if callable(getattr(ducxx, "init_once", None)) else "is not there"


def start_ucx(settings: Mapping[str, Any] | None = None) -> None:
    """Start UCX in this process as distributed-ucxx's listener would (once per process),
    under ``settings``: distributed-ucxx's own keys (``{"create-cuda-context": True,
    "environment": {"tls": "^cuda_ipc"}}``), defaults under what the user's config and
    environment set. Where UCX has started here already, nothing changes."""
    try:
        from distributed_ucxx.ucxx import init_once
    except ImportError as e:
        off("ucx_init_once", f"cannot be imported ({e})")
        return
    if not settings:
        init_once()
        return
    import dask.config

    # distributed-ucxx reads its own namespace first, the legacy distributed.comm.ucx after
    scoped = {f"distributed-ucxx.{k}": v for k, v in settings.items()
              if k != "environment" and dask.config.get(f"distributed-ucxx.{k}", default=None) is None}
    if settings.get("environment"):
        scoped["distributed-ucxx.environment"] = {
            **settings["environment"], **(dask.config.get("distributed-ucxx.environment", default=None) or {})}
    with dask.config.set(scoped):
        init_once()


@seam("ucxx_progress_net", "ucxx._lib_async.application_context.ProgressTasks, BlockingMode._progress_timeout",
      "ucxx", UCXX, "a UCX wake-up that ucxx's blocking progress misses costing up to 1 s, not a few ms")
def _check_progress_net() -> str | None:
    import inspect as _inspect

    from ucxx._lib_async import application_context, continuous_ucx_progress

    if not isinstance(getattr(application_context, "ProgressTasks", None), dict):
        return "application_context has no ProgressTasks dict"
    blocking = getattr(continuous_ucx_progress, "BlockingMode", None)
    if blocking is None:
        return "has no BlockingMode"
    if "progress_timeout" not in _inspect.signature(blocking.__init__).parameters:
        return "BlockingMode takes no progress_timeout"
    if not _reads(blocking._progress_with_timeout, "self._progress_timeout"):
        return "BlockingMode's safety net no longer reads _progress_timeout"
    return None


def tighten_progress_net(seconds: float) -> int:
    """Make ucxx's safety net for its blocking progress mode (the one distributed-ucxx
    starts) progress UCX after ``seconds`` without progress, not 1 s. That mode progresses
    UCX when the UCX worker's epoll descriptor fires; a wake-up it misses left every
    transfer of the process waiting for the net: on two H200s the collective's timed runs
    stalled 0.5-0.7 s in 2 of 5 (a data-plane reply took 0.72 s while its sender served in
    3 ms). Returns the event loops' progress tasks set (0 where UCX has not started here)."""
    if "ucxx" not in sys.modules:
        return 0  # UCX never started in this process: nothing to set, nothing to say
    if not usable("ucxx_progress_net"):
        return 0
    from ucxx._lib_async import application_context

    found = 0
    for task in list(application_context.ProgressTasks.values()):
        if hasattr(task, "_progress_timeout"):
            task._progress_timeout = seconds
            found += 1
    return found


@seam("ucxx_errors", "ucxx.exceptions.UCXError, ucxx.create_endpoint, ucxx.create_listener", "ucxx", UCXX,
      "the data plane")
def _check_ucxx() -> str | None:
    import ucxx

    for name in ("create_endpoint", "create_listener"):
        if not callable(getattr(ucxx, name, None)):
            return f"has no {name}"
    if not isinstance(getattr(getattr(ucxx, "exceptions", None), "UCXError", None), type):
        return "has no exceptions.UCXError"
    return None


def ucx_error() -> type:
    """ucxx's base error (a class nothing raises where there is none)."""
    try:
        import ucxx

        return ucxx.exceptions.UCXError
    except (ImportError, AttributeError) as e:
        off("ucxx_errors", f"cannot be read ({e})")
        return _Never


UCXX_CORE = ("UCXContext", "UCXWorker", "UCXEndpoint", "UCXAddress", "UCXXTag", "UCXXTagMaskFull", "Feature")


@seam("ucxx_core", "ucxx._lib.libucxx (" + ", ".join(UCXX_CORE) + "), ucxx._lib.arr.Array, "
      "ucxx._cuda_context.ensure_cuda_context", "ucxx", UCXX,
      "the exchange's UCXX transport (its steps' buffers go over the host transport)")
def _check_ucxx_core() -> str | None:
    from ucxx import _cuda_context
    from ucxx._lib import arr, libucxx

    missing = [n for n in UCXX_CORE if getattr(libucxx, n, None) is None]
    if missing:
        return f"libucxx has no {', '.join(missing)}"
    for owner, name in ((arr, "Array"), (_cuda_context, "ensure_cuda_context")):
        if not callable(getattr(owner, name, None)):
            return f"has no {name}"
    return None


def ucxx_core():
    """UCXX's core API (``api``: its bindings, ``Array``: a buffer's wrapper,
    ``device_context``: makes a thread's CUDA context current on a device), which the exchange's transport drives from the steps' own
    threads; None where it is not there or not of the known shape."""
    if not usable("ucxx_core"):
        return None
    from types import SimpleNamespace

    from ucxx import _cuda_context
    from ucxx._lib import arr, libucxx

    return SimpleNamespace(api=libucxx, Array=arr.Array, device_context=_cuda_context.ensure_cuda_context)


# --- dask-cuda (GPU hosts only: these checks skip where it is not installed)


@seam("dask_cuda_worker_spec", "LocalCUDACluster.new_worker_spec, .cuda_visible_devices, .worker_spec",
      "dask-cuda", DASK_CUDA, "several workers on one GPU of a local cluster (workers-per-gpu 1 still runs)")
def _check_cuda_cluster() -> str | None:
    from dask_cuda import LocalCUDACluster

    if not callable(getattr(LocalCUDACluster, "new_worker_spec", None)):
        return "has no new_worker_spec"
    if not _reads(LocalCUDACluster.__init__, "cuda_visible_devices"):
        return "LocalCUDACluster keeps no cuda_visible_devices"
    return None


def cuda_worker_spec(cluster, base: type, device) -> dict:
    """dask-cuda's spec of a worker of GPU ``device`` on ``cluster`` (of a subclass of
    ``base``, a LocalCUDACluster, that names its workers itself): ``base.new_worker_spec``
    gives the smallest visible GPU without a worker one, so for this call every other GPU
    looks taken."""
    started = cluster.worker_spec
    cluster.worker_spec = {d: None for d in cluster.cuda_visible_devices if d != device}
    try:
        ((_, spec),) = base.new_worker_spec(cluster).items()
    finally:
        cluster.worker_spec = started
    return spec


def spec_visible_devices(spec: Mapping) -> str:
    """The CUDA_VISIBLE_DEVICES a dask-cuda worker spec starts its worker with ("" where none)."""
    return str(((spec.get("options") or {}).get("env") or {}).get("CUDA_VISIBLE_DEVICES", ""))


@seam("dask_cuda_nannies", "CUDAWorker.nannies, Nanny.worker_kwargs, Nanny.env", "dask-cuda", DASK_CUDA,
      "the tiered store and several workers per GPU under `spillway worker` (it says so and stops)")
def _check_cuda_worker() -> str | None:
    from dask_cuda import CUDAWorker
    from distributed import Nanny

    if not _reads(CUDAWorker.__init__, "self.nannies"):
        return "CUDAWorker keeps no nannies"
    for name in ("self.worker_kwargs", "self.env"):
        if not _reads(Nanny.__init__, name):
            return f"Nanny keeps no {name.split('.')[1]}"
    return None


def nannies_of(cuda_worker) -> list:
    """The nannies of a dask-cuda CUDAWorker (not started yet while its __init__ runs)."""
    nannies = getattr(cuda_worker, "nannies", None)
    if nannies is None:
        off("dask_cuda_nannies", f"{type(cuda_worker).__name__} keeps no nannies")
        return []
    return list(nannies)


def nanny_env(nanny) -> dict | None:
    """The environment ``nanny`` starts its worker process with (a dict to change), or None."""
    env = getattr(nanny, "env", None)
    return env if isinstance(env, dict) else None


def nanny_worker_kwargs(nanny) -> dict | None:
    """The keywords ``nanny`` passes to the worker it starts (a dict to change), or None."""
    kwargs = getattr(nanny, "worker_kwargs", None)
    return kwargs if isinstance(kwargs, dict) else None


@seam("dask_cuda_affinity", "dask_cuda.utils.get_cpu_affinity, nvml_device_index", "dask-cuda", DASK_CUDA,
      "the pinned arena's growth on the cores next to the GPU (it runs on any core)")
def _check_affinity() -> str | None:
    from dask_cuda import utils

    for name in ("get_cpu_affinity", "nvml_device_index"):
        if not callable(getattr(utils, name, None)):
            return f"has no {name}"
    return None


def gpu_cores(visible: str) -> list[int]:
    """The cores next to the first GPU of ``visible`` (a CUDA_VISIBLE_DEVICES), as dask-cuda
    pins its workers' threads; none where dask-cuda cannot say."""
    try:
        from dask_cuda.utils import get_cpu_affinity, nvml_device_index
    except ImportError as e:
        off("dask_cuda_affinity", f"cannot be imported ({e})")
        return []
    return list(get_cpu_affinity(nvml_device_index(0, visible)) or [])


# --- zict (the buffers of dask-cuda's and distributed's worker stores)


@seam("zict_callbacks", "zict.Buffer.fast_to_slow_callbacks, slow_to_fast_callbacks", "zict", ZICT,
      "spill counts on dask-cuda's and distributed's stores (they read zero)")
def _check_zict() -> str | None:
    import zict

    buffer = zict.Buffer({}, {}, 1)
    for name in ("fast_to_slow_callbacks", "slow_to_fast_callbacks"):
        if not isinstance(getattr(buffer, name, None), list):
            return f"Buffer has no list {name}"
    return None


def spill_callbacks(buffer) -> tuple[list, list] | None:
    """The (fast-to-slow, slow-to-fast) callback lists of a zict Buffer (dask-cuda's device
    and host buffers, distributed's SpillBuffer), or None for anything else."""
    if buffer is None:
        return None
    out = getattr(buffer, "fast_to_slow_callbacks", None), getattr(buffer, "slow_to_fast_callbacks", None)
    return out if isinstance(out[0], list) and isinstance(out[1], list) else None


# --- dask-jobqueue: its public API only


@seam("jobqueue_script", "dask_jobqueue.core.Job(job_script_prologue=), Job.job_script, Job.job_file",
      "dask-jobqueue", DASK_JOBQUEUE, "spillway.slurm() (its job scripts)")
def _check_jobqueue() -> str | None:
    from dask_jobqueue.core import Job

    why = _has_parameters(Job.__init__, ("job_script_prologue", "python", "job_name"))
    if why is not None:
        return why
    if not _reads(Job.job_file, "self.job_script()"):
        return "Job.job_file no longer writes Job.job_script()"
    return None


# --- zarr: the buffer class its config names


@seam("zarr_host_ndbuffer", "zarr.core.buffer.cpu.NDBuffer.from_ndarray_like, zarr.registry.register_ndbuffer, "
      "zarr.config['ndbuffer']", "zarr", ZARR, "users' own zarr writes of device chunks on GPU workers")
def _check_zarr_ndbuffer() -> str | None:
    import zarr
    from zarr import registry
    from zarr.core.buffer import cpu

    if not isinstance(inspect.getattr_static(cpu.NDBuffer, "from_ndarray_like", None), classmethod):
        return "cpu.NDBuffer.from_ndarray_like is no longer a classmethod"
    if not callable(getattr(registry, "register_ndbuffer", None)):
        return "zarr.registry.register_ndbuffer is gone"
    why = _has_parameters(registry.register_ndbuffer, ("cls", "qualname"))
    if why is not None:
        return why
    if not isinstance(zarr.config.get("ndbuffer", None), str):
        return "zarr.config has no 'ndbuffer' name"
    return None


def use_ndbuffer(cls: type, qualname: str) -> bool:
    """Register ``cls`` (a subclass of zarr's ``cpu.NDBuffer``) under ``qualname`` and make
    it zarr's NDBuffer in this process; False where zarr is not of the shape known (its
    own buffer stays)."""
    if not usable("zarr_host_ndbuffer"):
        return False
    import zarr
    from zarr.registry import register_ndbuffer

    register_ndbuffer(cls, qualname=qualname)
    zarr.config.set({"ndbuffer": qualname})
    return True


def ndbuffer_name() -> str | None:
    """The name of the NDBuffer zarr's config makes its default here."""
    import zarr

    return zarr.config.get("ndbuffer", None)
