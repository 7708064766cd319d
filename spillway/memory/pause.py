"""Holding a worker's execution while its host is short of memory.

The store gives host memory back before each buffer it takes (:mod:`.books`), but a task's
own host temporaries and incoming transfers are not the store's: where they, or a disk
slower than the host fills, bring the machine under its headroom, the worker stops
starting tasks, as distributed pauses a worker past its memory limit, and the store
writes its host tier to disk until the headroom is back. distributed's own pause is off
on these workers (it counts the pinned arena, which is memory already taken, as if it
were growth: :mod:`spillway.launch.worker_config`), so this one reads the
store's books beside the kernel's figures instead.

A pause must end. Over the process's own limit with the host tier already on disk and no
task running, nothing the worker waits for can bring it under: what it holds is its own
(the pinned pool, CUDA, the libraries). It then resumes, says so with the numbers, and
reads the limit from what it holds now; the machine's headroom still pauses it, since
other processes can give that back.
"""

from __future__ import annotations

import logging
import threading
import time

from spillway import upstream
from spillway.options.sizes import format_bytes

logger = logging.getLogger("spillway.memory")

#: how often the host is read, and how often a long pause is said again
TICK_MS = 200
REPEAT_S = 30.0


class HostPause:
    def __init__(self, worker, store):
        self.worker = worker
        self.store = store
        self.paused = False
        #: times the worker was paused, and seconds paused in all (also while paused now)
        self.pauses = 0
        self._paused_s = 0.0
        self._since: float | None = None
        self._said_at = 0.0
        self._relieving = threading.Event()
        #: reliefs finished since this pause began
        self._relieved = 0
        #: resident bytes found to be the process's own (None: none found)
        self.process_floor: int | None = None
        self._said_full_at = -REPEAT_S

    @property
    def paused_s(self) -> float:
        return self._paused_s + (time.monotonic() - self._since if self._since is not None else 0.0)

    def tick(self) -> None:
        from distributed.core import Status

        worker, books = self.worker, self.store.books
        reason = books.pressure(self.paused, self.process_floor)
        if reason is None and self.process_floor is not None and not self.paused:
            if books.last_resident <= books.process_limit:
                self.process_floor = None  # back under the limit: read it as given again
        if reason is not None and self.paused and self._unrelievable():
            self.process_floor = books.last_resident
            logger.error("%s: %s with its host tier on disk and no task running: nothing it waits for "
                         "frees that (the pinned pool, CUDA and the libraries are the process's own); "
                         "resuming after %.0f s and pausing again only past %s or under the machine's headroom",
                         self.store.name, reason, self.paused_s,
                         format_bytes(books.floor_limit(self.process_floor)))
            self._resume(Status)
            return
        if reason is not None and not self.paused:
            if worker.status != Status.running:
                return
            worker.status = Status.paused
            self.paused, self.pauses, self._since = True, self.pauses + 1, time.monotonic()
            self._relieved = 0
            self._said_at = self._since
            logger.warning("%s paused: %s; writing its host tier to disk", self.store.name, reason)
        elif reason is None and self.paused:
            self._resume(Status)
            return
        elif reason is not None and time.monotonic() - self._said_at > REPEAT_S:
            self._said_at = time.monotonic()
            logger.warning("%s still paused after %.0f s: %s (host tier %d bytes, disk %d bytes)",
                           self.store.name, self.paused_s, reason, self.store.host_bytes,
                           self.store.below_bytes)
        if self.paused and not self._relieving.is_set():
            self._relieving.set()
            threading.Thread(target=self._relieve, name="spillway-relieve-host", daemon=True).start()

    def _resume(self, Status) -> None:
        if self.worker.status == Status.paused:
            self.worker.status = Status.running
        self._paused_s += time.monotonic() - self._since
        logger.warning("%s resumed after %.1f s paused for host memory", self.store.name,
                       time.monotonic() - self._since)
        self.paused, self._since = False, None

    def _relieve(self) -> None:
        from spillway.options.errors import SpillDiskFull

        try:
            self.store.relieve_host()
        except SpillDiskFull as e:  # said once by the store to the scheduler, which stops the work
            if time.monotonic() - self._said_full_at > REPEAT_S:
                self._said_full_at = time.monotonic()
                logger.warning("%s", e)
        except Exception:  # a failed write leaves the values where they were
            logger.exception("%s: writing the host tier to disk while paused failed", self.store.name)
        finally:
            self._relieved += 1
            self._relieving.clear()

    def _unrelievable(self) -> bool:
        """Paused over the process limit alone, the host tier written out (a relief has
        finished and left nothing on the host), and no task running whose end would free
        memory."""
        if not self.store.books.over_process_limit or self._relieving.is_set() or not self._relieved:
            return False
        if self.store.host_bytes:
            return False
        return not upstream.tasks_executing(self.worker)

    def summary(self) -> dict:
        return {"paused": self.paused, "pauses": self.pauses, "paused_s": round(self.paused_s, 3)}
