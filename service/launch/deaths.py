"""Why workers did not start: the nanny's word on each worker process that died.

distributed logs a worker process's death ("was killed by signal 9") at INFO, which the
quieted cluster logs hide. A worker the kernel's out-of-memory killer ends while it starts
(taking a pinned pool, say) then leaves only "0/2 workers arrived after 120 s". These
messages are collected while a cluster starts and put into the error instead.
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
