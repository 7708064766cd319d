"""What an exchange's steps keep on a worker between them: the worker's transports (made
at the first step that needs one, kept for the worker's life), the attempts the scheduler
ended, and what the steps measured. One :class:`StepState` a worker, in the worker plugin
the first step there adds; steps run without a distributed worker (dask's local
schedulers) keep their outputs in :data:`LOCAL_OUTPUTS`.

The outputs a step joined are values in the worker's store (counted, spilled to host and
disk like any other) until their getters take them; what an ended exchange left there is
dropped when the scheduler says so (:data:`DROP`).

Nothing here imports distributed: the local schedulers' path runs without it.
"""

from __future__ import annotations

import threading

from spillway.datapath.collective.state import Phases

#: the name of the worker plugin that holds a worker's :class:`StepState`
WORKER_PLUGIN = "spillway-step-worker"
#: the scheduler's messages to a worker: an exchange's attempt ended; an exchange ended
ABORT = "spillway-step-abort"
DROP = "spillway-step-drop"

#: outputs of steps run without a distributed worker: (exchange, flat output index) -> array
LOCAL_OUTPUTS: dict = {}
LOCAL_LOCK = threading.Lock()


class StepState:
    def __init__(self):
        self._lock = threading.Lock()
        self._transports: dict = {}
        #: exchange name -> (the attempt that ended, why)
        self._ended: dict[str, tuple[int, str]] = {}
        self.phases = Phases()
        #: rounds moved over each transport kind (the report says which the cluster chose)
        self.moved_over: dict[str, int] = {}

    def transport(self, kind: str, *, host: str, gpu: bool):
        """This worker's transport of ``kind``, started by its first use."""
        with self._lock:
            found = self._transports.get(kind)
            if found is None:
                found = self._transports[kind] = make(kind, host=host, gpu=gpu)
            return found

    def end(self, name: str, attempt: int, why: str) -> None:
        """The scheduler ended attempt ``attempt`` of ``name`` (and every one before)."""
        with self._lock:
            known = self._ended.get(name)
            if known is None or known[0] < attempt:
                self._ended[name] = (attempt, why)

    def ended(self, name: str, attempt: int) -> str | None:
        """Why attempt ``attempt`` of ``name`` ended, None while it runs."""
        known = self._ended.get(name)
        return known[1] if known is not None and known[0] >= attempt else None

    def forget(self, name: str) -> None:
        with self._lock:
            self._ended.pop(name, None)

    def close(self) -> None:
        with self._lock:
            transports = list(self._transports.values())
            self._transports.clear()
        for transport in transports:
            transport.close()


def state_of(worker) -> StepState | None:
    plugin = getattr(worker, "plugins", {}).get(WORKER_PLUGIN)
    return None if plugin is None else plugin.state


def make(kind: str, *, host: str, gpu: bool):
    """A started transport of ``kind`` on this worker (``host``: the interface its
    listener binds to)."""
    if kind == "host":
        from .tcp import HostTransport

        return HostTransport(host)
    if kind == "ucxx":
        from .ucx import UcxxTransport

        return UcxxTransport(gpu=gpu)
    if kind == "ipc":
        from .ipc import IpcTransport

        return IpcTransport(gpu=gpu)
    raise ValueError(f"transport {kind!r} is not ipc, ucxx or host")
