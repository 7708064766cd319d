"""Whether the job database answers: which errors mean "unreachable", and the service's
view of it (down since when, why), kept current by a probe thread.

The API answers 503 while the database is down rather than queueing requests behind
connection attempts, and ``/healthz`` reads the view here instead of the database, so it
stays fast whatever the database does. The probe also caches the job counts that
``/healthz`` reports.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone

from sqlalchemy import exc as sa_exc

logger = logging.getLogger("spillway.jobdb")

#: errors of a database that cannot be reached (refused, dropped, timed out, locked) rather
#: than of a request: worth retrying, and answered 503, never 500
_UNAVAILABLE = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.DisconnectionError, sa_exc.TimeoutError)


def is_unavailable(e: BaseException) -> bool:
    if isinstance(e, _UNAVAILABLE):
        return True
    return isinstance(e, sa_exc.DBAPIError) and bool(getattr(e, "connection_invalidated", False))


def one_line(e: BaseException) -> str:
    """The driver's own first line (``connection refused``), without SQLAlchemy's trailer."""
    inner = getattr(e, "orig", None) or e
    text = str(inner).strip().splitlines()
    return (text[0] if text else type(inner).__name__)[:300]


class DatabaseHealth:
    """The service's view of the job database. Anyone who meets an unreachable database
    calls :meth:`failed` (so the API stops sending requests to it at once); only a
    successful probe (or :meth:`ok`) marks it back up."""

    def __init__(self, probe=None, *, interval_s: float = 2.0, down_interval_s: float = 0.5):
        self._probe = probe
        self.interval_s = interval_s
        self.down_interval_s = down_interval_s
        self._lock = threading.Lock()
        self.down_since: float | None = None  # time.time() of the first failure
        self.error: str | None = None
        #: what the API may say of the error: its kind only (the driver's text names the
        #: database's host, port and user, which are the service's own business: the log has it)
        self.public_error: str | None = None
        self.checked: float | None = None
        #: the last counts the probe read (None until the first probe)
        self.counts: dict[str, int] | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def down(self) -> bool:
        return self.down_since is not None

    @property
    def probing(self) -> bool:
        """Whether the probe thread runs (and so will notice the database coming back)."""
        return self._thread is not None and self._thread.is_alive()

    def failed(self, e: BaseException | str):
        message = e if isinstance(e, str) else one_line(e)
        kind = "unreachable" if isinstance(e, str) else type(getattr(e, "orig", None) or e).__name__
        with self._lock:
            first = self.down_since is None
            if first:
                self.down_since = time.time()
            self.error = message
            self.public_error = f"no answer ({kind})"
        if first:
            logger.warning("job database unreachable: %s; running jobs go on and their ends are "
                           "recorded when it answers again", message)
            self._wake.set()

    def ok(self):
        with self._lock:
            since, self.down_since, self.error, self.public_error = self.down_since, None, None, None
        if since is not None:
            logger.warning("job database answers again after %.1f s", time.time() - since)

    def retry_after_s(self) -> int:
        """What a 503 tells clients to wait: the probe's period while down, at least 1 s."""
        return max(1, round(self.down_interval_s * 2))

    def as_dict(self) -> dict:
        iso = (lambda t: None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat())
        return {"ok": not self.down, "error": self.public_error, "down_since": iso(self.down_since),
                "checked": iso(self.checked)}

    # --- the probe thread

    def probe_once(self) -> bool:
        try:
            counts = self._probe()
        except Exception as e:  # noqa: BLE001 (any failure of the probe means not answering)
            self.failed(e)
            return False
        finally:
            self.checked = time.time()
        self.counts = counts
        self.ok()
        return True

    def start(self):
        if self._probe is None or self._thread is not None:
            return
        self.probe_once()
        self._thread = threading.Thread(target=self._run, name="spillway-jobdb-probe", daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self):
        while not self._stop.is_set():
            self._wake.wait(self.down_interval_s if self.down else self.interval_s)
            self._wake.clear()
            if not self._stop.is_set():
                self.probe_once()


class Unavailable(Exception):
    """Raised for a request while the job database is known to be down (answered 503
    without trying it)."""

    def __init__(self, health: DatabaseHealth):
        self.health = health
        super().__init__(health.error or "the job database is unreachable")
