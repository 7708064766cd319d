"""Why workers did not start: the nanny's word on each worker process that died.

distributed logs a worker process's death ("was killed by signal 9") at INFO, which the
quieted cluster logs hide. A worker the kernel's out-of-memory killer ends while it starts
(taking a pinned pool, say) then leaves only "0/2 workers arrived after 120 s". These
messages are collected while a cluster starts and put into the error instead, and while a
run goes on (:class:`Workers`), to name the workers it lost and why.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Iterator

from distributed.diagnostics.plugin import NannyPlugin

from .. import upstream
from spillway.options.errors import ClusterStartError

_DEATH = re.compile(r"Worker process \d+ (was killed by [^\n]*|exited with status -?\d+)"
                    r"|Worker \S+ \(pid=\d+\) exceeded \d+% memory budget")
#: the pid and what became of it, from one of those messages
_PID_REASON = re.compile(r"Worker process (\d+) (.*)|Worker \S+ \(pid=(\d+)\) (exceeded \d+% memory budget)")


def death_reasons(messages: list[str]) -> dict[int, str]:
    """pid -> why its worker process ended (``killed by signal 9``; ``out of memory:
    exceeded 95% memory budget, killed by signal 15``), from the nanny's messages."""
    out: dict[int, str] = {}
    for message in messages:
        found = _PID_REASON.fullmatch(message)
        if not found:
            continue
        if found.group(1):
            pid, what = int(found.group(1)), found.group(2).removeprefix("was ")
            out[pid] = f"{out[pid]}, {what}" if pid in out else what
        else:
            pid = int(found.group(3))
            out[pid] = f"out of memory: {found.group(4)}" + (f", {out[pid]}" if pid in out else "")
    return out


class WorkerDeaths:
    """The nanny's worker-death messages seen while it listens (:func:`watch_worker_deaths`)."""

    def __init__(self):
        self.messages: list[str] = []

    def hear(self, message: str) -> None:
        self.messages.append(message)


class _Listening(logging.Handler):
    """One handler on the nanny's logger for every listener of this process (the messages
    of a :func:`watch_worker_deaths` block, and the :class:`DeathRelay` of each nanny the
    process runs), so that they can come and go in any order: while any listens, the
    logger lets INFO through, but only the deaths among what its level would have dropped."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.listeners: list = []
        self._saved: tuple[int, int] | None = None
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        found = _DEATH.search(record.getMessage())
        if found:
            for listener in list(self.listeners):
                try:
                    listener.hear(found.group(0))
                except Exception:  # noqa: BLE001 (a listener never breaks the nanny's logging)
                    pass

    def _quiet(self, record: logging.LogRecord) -> bool:
        effective = self._saved[1] if self._saved else logging.NOTSET
        return record.levelno >= effective or bool(_DEATH.search(record.getMessage()))

    def add(self, listener) -> None:
        with self._guard:
            self._add(listener)

    def remove(self, listener) -> None:
        with self._guard:
            self._remove(listener)

    def _add(self, listener) -> None:
        log = logging.getLogger("distributed.nanny")
        if not self.listeners:
            level, effective = log.level, log.getEffectiveLevel()
            self._saved = (level, effective)
            log.addHandler(self)
            if effective > logging.INFO:
                log.setLevel(logging.INFO)
                log.addFilter(self._quiet)
        self.listeners.append(listener)

    def _remove(self, listener) -> None:
        if listener in self.listeners:
            self.listeners.remove(listener)
        if self.listeners or self._saved is None:
            return
        log = logging.getLogger("distributed.nanny")
        log.removeHandler(self)
        log.removeFilter(self._quiet)
        log.setLevel(self._saved[0])
        self._saved = None


_LISTENING = _Listening()


@contextlib.contextmanager
def watch_worker_deaths() -> Iterator[WorkerDeaths]:
    """Collect the nanny's worker-death messages of this process while the block runs."""
    deaths = WorkerDeaths()
    _LISTENING.add(deaths)
    try:
        yield deaths
    finally:
        _LISTENING.remove(deaths)


def start_failure(expected: int, arrived: int | None, timeout: float, deaths: list[str]) -> ClusterStartError:
    """The one-line error for workers that did not start."""
    got = "" if arrived is None else f"{arrived} of "
    message = f"{got}{expected} workers started within {timeout:g} s"
    if deaths:
        message += ": " + "; ".join(dict.fromkeys(deaths))
        if any("signal 9" in d for d in deaths):
            message += (" (signal 9 while starting is usually the kernel's out-of-memory killer: "
                        "compare pinned-pool-size and memory-limit per worker with the host's memory)")
    else:
        message += ": no worker process died; see the workers' logs"
    return ClusterStartError(message)


# --- why a worker died, told to the scheduler by its nanny

#: the scheduler's event topic of the deaths the nannies report (:class:`DeathRelay`)
DEATH_TOPIC = "spillway-worker-death"

_SIGNALS = {
    9: ("SIGKILL", "the kernel's OOM killer? see dmesg"),
    15: ("SIGTERM", None),
    11: ("SIGSEGV", "a crash in native code: CUDA or a library"),
    6: ("SIGABRT", "an abort in native code"),
    7: ("SIGBUS", "a bad memory access: out of shared memory?"),
    2: ("SIGINT", None),
}


def describe(reason: str) -> str:
    """A nanny's words on a death (``killed by signal 9``, ``out of memory: exceeded 95%
    memory budget, killed by signal 15``) with the signal named and what usually sends it:
    ``killed by SIGKILL (the kernel's OOM killer? see dmesg)``."""
    def name(found: re.Match) -> str:
        signal, hint = _SIGNALS.get(int(found.group(1)), (f"signal {found.group(1)}", None))
        # the nanny's own memory kill is already said; the kernel's is the guess
        if hint and not reason.startswith("out of memory"):
            return f"killed by {signal} ({hint})"
        return f"killed by {signal}"

    return re.sub(r"killed by signal (\d+)", name, reason)


class DeathRelay(NannyPlugin):
    """A nanny plugin: when the nanny's worker process dies, it logs why on the scheduler
    (event topic :data:`DEATH_TOPIC`: the worker's address, pid, GPU and the reason), so
    that a run on any cluster, the nannies in this process or on other nodes, can name it.
    distributed itself keeps the reason in the nanny's log, at INFO."""

    name = "spillway-death-relay"
    idempotent = True

    def setup(self, nanny):
        self.nanny = nanny
        #: the memory-budget kill announced for a pid, said with its death
        self._budget: dict[int, str] = {}
        _LISTENING.add(self)

    def teardown(self, nanny):
        _LISTENING.remove(self)

    def _worker(self):
        """(pid, address) of the nanny's worker process, dying or alive, else None."""
        process = getattr(self.nanny, "process", None)  # distributed's WorkerProcess
        inner = getattr(process, "process", None)
        pid = getattr(inner, "pid", None)
        return (pid, process.worker_address) if pid else None

    def hear(self, message: str) -> None:
        # every nanny of a process hears every message of the process's nannies: only
        # its own worker's are told
        worker = self._worker()
        if worker is None:
            return
        pid, address = worker
        reasons = death_reasons([message])
        if pid not in reasons:
            return
        reason = reasons[pid]
        if reason.startswith("out of memory") and not message.startswith("Worker process"):
            self._budget[pid] = reason  # the kill follows
            return
        if pid in self._budget:
            reason = f"{self._budget.pop(pid)}, {reason}"
        env = getattr(self.nanny, "env", None) or {}
        gpu = str(env.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0] or None
        event = {"address": address, "pid": pid, "reason": reason, "gpu": gpu, "name": str(self.nanny.name)}
        # False: the nanny is closing, and nobody waits for the reason
        upstream.call_soon_on(self.nanny, self._tell, event)

    async def _tell(self, event: dict) -> None:
        try:
            await self.nanny.scheduler.log_event(topic=DEATH_TOPIC, msg=event)
        except OSError:  # the scheduler gone too (CommClosedError): the run fails for that
            pass

