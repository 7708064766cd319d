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
from collections.abc import Iterator

from ..errors import ClusterStartError

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


class WorkerDeaths(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = _DEATH.search(record.getMessage())
        if found:
            self.messages.append(found.group(0))


@contextlib.contextmanager
def watch_worker_deaths() -> Iterator[WorkerDeaths]:
    """Collect the nanny's worker-death messages of this process while the block runs."""
    log = logging.getLogger("distributed.nanny")
    handler = WorkerDeaths()
    level, effective = log.level, log.getEffectiveLevel()
    log.addHandler(handler)
    quiet = None
    if effective > logging.INFO:
        # let the deaths through, and nothing else the level would have dropped
        def quiet(record: logging.LogRecord) -> bool:
            return record.levelno >= effective or bool(_DEATH.search(record.getMessage()))

        log.setLevel(logging.INFO)
        log.addFilter(quiet)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        if quiet is not None:
            log.removeFilter(quiet)
        log.setLevel(level)


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


# --- workers lost during a run


class Workers:
    """The workers at a run's start (address and pid), and (from the nannies of this
    process, where the cluster is local) why any of them died."""

    def __init__(self, client):
        self.client = client
        self.start = self._now()
        self.pids = self._pids()
        self._deaths = None
        try:
            self._watch = watch_worker_deaths()
            self._deaths = self._watch.__enter__()
        except Exception:  # noqa: BLE001 (the reason is a nicety; the loss is still named)
            self._watch = None

    def _now(self) -> set[str]:
        try:
            return set(self.client.scheduler_info(n_workers=-1)["workers"])
        except Exception:  # noqa: BLE001
            return set()

    def _pids(self) -> dict[str, int]:
        import os

        try:
            return dict(self.client.run(os.getpid, on_error="ignore"))
        except Exception:  # noqa: BLE001 (a worker going away now is seen as lost later)
            return {}

    def _gone(self) -> list[str]:
        return sorted(self.start - self._now())

    def reasons(self, gone: list[str]) -> tuple[dict[str, str], list[str]]:
        """Why each of ``gone`` died where a nanny of this process said (address -> reason),
        and the nanny's messages about workers not among them."""
        messages = list(self._deaths.messages) if self._deaths is not None else []
        by_pid = death_reasons(messages)
        why = {addr: by_pid.pop(self.pids[addr]) for addr in gone if self.pids.get(addr) in by_pid}
        return why, [f"pid {pid} {what}" for pid, what in by_pid.items()]

    def lost_list(self) -> list[dict]:
        """The workers lost during the run: ``{"address", "pid", "reason"}`` each."""
        gone = self._gone()
        why, _ = self.reasons(gone)
        self.close()
        return [{"address": a, "pid": self.pids.get(a), "reason": why.get(a)} for a in gone]

    def lost(self) -> str:
        """One line naming the lost workers and why (empty where none was lost)."""
        gone = self._gone()
        why, others = self.reasons(gone)
        self.close()
        if not gone and not others:
            return ""
        named = [f"{a} ({why[a]})" if a in why else a for a in gone]
        text = f"worker{'s' if len(gone) != 1 else ''} lost: {', '.join(named) or 'unknown'}"
        return text + (f" ({'; '.join(others)})" if others else "")

    def close(self):
        if self._watch is not None:
            self._watch.__exit__(None, None, None)
            self._watch = None
