"""Bearer-token authentication: a token names one tenant (or an admin).

Tokens expire (401 naming when) and are rotated by issuing the next before revoking the
last (:mod:`spillway.service.jobdb.tokens`). Each use is recorded at most once a minute.

Tokens are resolved from memory (:class:`KnownTokens`): every token that is not revoked,
with its tenant and expiry, read at start and again every second in one query, so a
request with a valid token costs the database nothing (issue 74: each one's lookup queued
on the pool of 10 connections; 1,200 slow bodies with a valid token got 177 503s and held
``/healthz`` up to 1.3 s). A token revoked, or a tenant added or changed, by
``spillway tenant`` (another process, writing to the database) is seen within a second
plus the read, and never later than :data:`MAX_AGE_S`: a table older than that is not
answered from. While the database is down a token cannot be checked, so every request
that needs a tenant answers 503: a token revoked by ``spillway tenant revoke`` must not act
because it was valid before the outage (issue 45).

A request is authenticated from its headers before anything reads its body
(:class:`~.gate.Authenticate`): a request without a valid token costs the service a header
and a digest, never the parse of its body (issue 74: a 640 KB body of 60,000 keys without a
token was parsed, and answered 422). A missing token counts as a failure, as a wrong one does.

An address whose tokens failed ``--max-auth-failures`` times in the last minute gets 429
with ``Retry-After`` for the next token the service does not know (:class:`AuthFailures`,
issue 53: a bad token cost a database lookup, 235 a second, with no limit). Which tokens are
live is known without asking the database (:class:`KnownTokens`), so a valid tenant behind
that address is served, whether or not it was seen since the start (issue 74: the
protection covered only tokens seen since start, and none after a restart). A token that
keeps failing from an address (a revoked one a client is stuck on) is held back by its own
count there.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time

from fastapi import HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..jobdb import is_unavailable
from ..jobdb.health import Unavailable
from ..jobdb.rows import hash_token
from ..jobdb.tokens import INVALID, expired_why

logger = logging.getLogger("spillway.api")

bearer = HTTPBearer(auto_error=False, description="A tenant token from `spillway tenant add` or `spillway tenant token`.")

UNAUTHORIZED = {"WWW-Authenticate": "Bearer"}


class AuthFailures:
    """Failed token checks over the last ``window_s`` seconds, per client address and per
    token (its digest) at that address: past ``limit`` either way the request may get 429
    with ``Retry-After`` before its token is looked up (:func:`current_tenant` decides),
    so guessing tokens (or a client stuck on a revoked one) costs the database nothing.
    Holds at most ``max_keys`` addresses and tokens each (the quietest go first)."""

    def __init__(self, limit: int, window_s: float = 60.0, max_keys: int = 65536):
        self.limit = limit
        self.window_s = window_s
        self.max_keys = max_keys
        self._failures: collections.OrderedDict[tuple, collections.deque] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.refused = 0

    def held_back(self, addr: str, digest: str = "") -> tuple[int, str] | None:
        """(seconds until it may try again, "token" or "address") for a request from
        ``addr`` with the token of ``digest`` (none: ""), or None where neither count is
        past the limit."""
        now = time.monotonic()
        with self._lock:
            if digest:
                wait = self._wait(("token", addr, digest), now)
                if wait is not None:
                    return wait, "token"
            wait = self._wait(("address", addr), now)
            return None if wait is None else (wait, "address")

    def retry_after_s(self, addr: str, digest: str = "") -> int | None:
        held = self.held_back(addr, digest)
        return None if held is None else held[0]

    def _wait(self, key: tuple, now: float) -> int | None:
        times = self._failures.get(key)
        if times is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[key]
            return None
        if len(times) < self.limit:
            return None
        return max(1, math.ceil(times[0] + self.window_s - now))

    def failed(self, addr: str, digest: str = "") -> None:
        now = time.monotonic()
        keys = [("address", addr)] + ([("token", addr, digest)] if digest else [])
        with self._lock:
            for key in keys:
                times = self._failures.pop(key, None) or collections.deque(maxlen=self.limit)
                times.append(now)
                self._failures[key] = times  # the most recent last
            while len(self._failures) > 2 * self.max_keys:
                self._failures.popitem(last=False)

    def refuse(self) -> None:
        with self._lock:
            self.refused += 1


#: seconds between the reads of the token table (:class:`KnownTokens`): how soon a token
#: revoked, added or changed by another process (``spillway tenant``) is seen, as a rule
REFRESH_S = 1.0
#: a table read longer ago than this is never answered from: the request waits for a read
#: (or gets 503 while the database cannot give one). The bound on a revocation made
#: elsewhere, whatever the reader thread meets
MAX_AGE_S = 3.0
#: the longest a request waits for another's read of the token table before it is answered
#: 503 (a database that takes longer does not answer)
READ_WAIT_S = 10.0


class WouldWait(Exception):
    """:func:`current_tenant` with ``wait=False`` needs the token table read first, which
    waits on the database: call it again off the event loop."""


class KnownTokens:
    """Every token that is not revoked, with what it resolves to (its tenant, as
    :meth:`JobDB.authenticate <spillway.service.jobdb.JobDB.authenticate>` answers, and its
    expiry), read from the job database at start (``spillway serve`` calls :meth:`refresh`)
    and again every :data:`REFRESH_S` by a thread of its own, in one query on a connection
    of its own (:meth:`JobDB.live_tokens <spillway.service.jobdb.JobDB.live_tokens>`). A
    request is answered from it with no query: a valid token's tenant, or 401 for a token it
    does not hold ("invalid or revoked token") or one past its expiry (checked at each
    request against the expiry read, so an expiry needs no read). A use is recorded by the
    same thread (at most once a minute per token), not by the request.

    How it stays in step with tokens and tenants added, revoked or changed by another
    process (``spillway tenant`` writes the database while ``serve`` runs): the whole table
    is read again every second, rather than when a generation counter that the writers bump
    says it changed. A counter would need every writer to bump it (this ``spillway``, an
    older one, one on another host of a PostgreSQL database, an owner's own SQL, a restored
    backup) and a schema step, and would still cost a query a second to watch; the read is
    one query a second whatever the request rate, a few rows per tenant, and misses no
    writer. Its bound holds even when the thread stalls: a table read more than
    :data:`MAX_AGE_S` ago is not answered from; the request reads it again itself (one
    read for all that wait) or gets 503 while the database cannot answer. So a token revoked
    elsewhere stops working within :data:`REFRESH_S` plus a read, and never later than
    :data:`MAX_AGE_S`; one added is served within the same."""

    def __init__(self, jobdb, refresh_s: float = REFRESH_S, max_age_s: float = MAX_AGE_S):
        self.jobdb = jobdb
        self.refresh_s = refresh_s
        self.max_age_s = max(max_age_s, refresh_s)
        #: digest -> (expiry as time.time(), or None; the tenant answered for it)
        self._table: dict[str, tuple[float | None, dict]] = {}
        self._read_at = -math.inf  # time.monotonic() when the last good read began
        self._tried_at = -math.inf  # when the reader thread last began one
        self._took_s = 0.0  # how long the last good read took
        self._lock = threading.Lock()
        self._reading = False
        self._used: set[int] = set()
        self._used_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self.reads = 0

    # --- what a request asks (no query, never waits)

    @property
    def ever_read(self) -> bool:
        return self._read_at > -math.inf

    def fresh(self) -> bool:
        """Whether the table may be answered from (read less than ``max_age_s`` ago)."""
        return time.monotonic() - self._read_at < self.max_age_s

    @property
    def keeping(self) -> bool:
        """Whether the reader thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def tenant(self, digest: str) -> tuple[dict | None, str | None]:
        """(tenant, None) for the token of ``digest``; (None, why) for one not held or
        expired, ``why`` the one line of :meth:`JobDB.authenticate`. The tenant is the
        caller's own copy."""
        entry = self._table.get(digest)
        if entry is None:
            return None, INVALID
        expires_at, tenant = entry
        if expires_at is not None and expires_at <= time.time():
            return None, expired_why(tenant["token_expires"], tenant["name"])
        return dict(tenant), None

    def known(self, digest: str) -> bool:
        """Whether ``digest`` is a live token's (held and not expired), as of the last read."""
        entry = self._table.get(digest)
        return entry is not None and (entry[0] is None or entry[0] > time.time())

    def known_now(self, digest: str) -> bool:
        """:meth:`known`, for ``/healthz``: a stale or missing read is started in a thread
        of its own, for the next caller (in an app whose reader thread does not run)."""
        if time.monotonic() - self._read_at >= self.refresh_s and not self._reading and not self.keeping:
            self._reading = True
            threading.Thread(target=self._read_quietly, name="spillway-known-tokens", daemon=True).start()
        return self.known(digest)

    def next_read_in_s(self) -> int:
        """Whole seconds (at least 1) until a token added now is known: the next read's end."""
        return max(1, math.ceil(self._read_at + self.refresh_s + 2 * self._took_s + 0.05 - time.monotonic()))

    def used(self, token_id: int) -> None:
        """A request was served with token ``token_id``: recorded by the reader thread."""
        with self._used_lock:
            self._used.add(token_id)

    # --- reads

    def refresh(self) -> None:
        """Read the tokens now and keep reading them (``spillway serve`` at start, so the
        first requests find them)."""
        with self._lock:
            self._read()
        self.start()

    def ensure_fresh(self, force: bool = False) -> None:
        """Read the table unless it is fresh (``force``: whether or not, as where the
        database is known down with nothing watching it: the read tells whether it is
        back), or wait (at most :data:`READ_WAIT_S`) for a read under way; the database's
        error where it cannot (this thread waits on it: call it off the event loop). Starts
        the reader thread where it does not run."""
        if force or not self.fresh():
            if not self._lock.acquire(timeout=READ_WAIT_S):
                from sqlalchemy.exc import TimeoutError as PoolTimeout

                raise PoolTimeout(f"the token table was not read within {READ_WAIT_S:g} s")
            try:
                if force or not self.fresh():
                    self._read()
            finally:
                self._lock.release()
        self.start()

    def _read(self):
        began = time.monotonic()
        table = {}
        for digest, expires, tenant in self.jobdb.live_tokens():
            table[digest] = (None if expires is None else expires.timestamp(), tenant)
        self._table = table
        self._read_at = began
        self._took_s = time.monotonic() - began
        self.reads += 1
        health = getattr(self.jobdb, "health", None)
        if health is not None and not health.probing:
            health.ok()  # it answered (for an app whose probe is not running)

    def _read_quietly(self):
        try:
            with self._lock:
                self._read()
        except Exception:  # noqa: BLE001 (the database down: the next caller tries again)
            pass
        finally:
            self._reading = False

    # --- the reader thread

    def start(self) -> None:
        with self._thread_lock:
            if self.keeping or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._keep, name="spillway-tokens", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop reading (the app's shutdown) and record the uses not yet recorded."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(READ_WAIT_S)
        self._record_uses()

    def _keep(self):
        failing = False
        # a read every refresh_s from the last one's start (the one at start or a request's
        # included), so that :meth:`next_read_in_s` tells when the next one ends
        while not self._stop.wait(max(0.0, max(self._read_at, self._tried_at) + self.refresh_s - time.monotonic())):
            if getattr(self.jobdb, "closed", False) is True:
                return
            self._tried_at = time.monotonic()
            try:
                with self._lock:
                    self._read()
                failing = False
            except Exception as e:  # noqa: BLE001 (the thread must go on: the next read may work)
                if is_unavailable(e):
                    self.jobdb.health.failed(e)
                elif not failing:
                    logger.error("reading the token table failed; it is read again every %g s", self.refresh_s,
                                 exc_info=e)
                failing = True
            self._record_uses()

    def _record_uses(self):
        with self._used_lock:
            used, self._used = self._used, set()
        for token_id in used:
            try:
                self.jobdb.touch_token(token_id)
            except Exception as e:  # a use not recorded is no reason to stop
                if not is_unavailable(e):
                    logger.warning("recording a use of token %s failed: %s", token_id, e)


def client_address(request: Request) -> str:
    """The client's address (a trusted proxy's X-Forwarded-For already applied by uvicorn)."""
    return request.client.host if request.client else "unknown"


def from_this_machine(request: Request) -> bool:
    """Whether the request comes from the service's own machine: a loopback address (after
    a trusted proxy's X-Forwarded-For). A proxy on this machine that is not named with
    ``--trusted-proxy`` makes every request it forwards look so."""
    import ipaddress

    try:
        return ipaddress.ip_address(client_address(request)).is_loopback
    except ValueError:
        return False


def bearer_token(request: Request) -> str | None:
    """The token of the request's ``Authorization: Bearer`` header, or None."""
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def current_tenant(request: Request, credentials: HTTPAuthorizationCredentials | None = None, *,
                   wait: bool = True) -> dict:
    """The token's tenant, from :class:`KnownTokens` (no query); 401 with one line for a
    missing, unknown, revoked or expired token; 429 for an address (or a token at it) past
    ``--max-auth-failures`` whose token is not a live one; 503 (:class:`Unavailable`) while
    the database is down, or while the token table cannot be read and its last read is
    older than :data:`MAX_AGE_S`. ``credentials``: FastAPI's reading of the header, where a
    route has it; the header itself otherwise. ``wait`` False: :class:`WouldWait` where
    the table must be read first (the gate calls it so on the event loop, and again in a
    thread then); nothing is counted before that."""
    if credentials is not None:
        token = credentials.credentials if credentials.scheme.lower() == "bearer" else None
    else:
        token = bearer_token(request)
    failures: AuthFailures | None = getattr(request.app.state, "auth_failures", None)
    addr = client_address(request)
    if not token:
        if failures is not None:
            failures.failed(addr)  # a client without a token is refused as one with a wrong one
        raise HTTPException(401, "missing bearer token (Authorization: Bearer <token>)", headers=UNAUTHORIZED)
    known: KnownTokens = request.app.state.known_tokens
    jobdb = request.app.state.jobdb
    if not known.ever_read:
        _read_first(known, jobdb, wait)
    digest = hash_token(token)
    held = failures.held_back(addr, digest) if failures is not None else None
    if held is not None:
        wait_s, which = held
        # a valid tenant behind an address that others' failures hold back is served: only a
        # token that is no live one waits, and finding that out costs no lookup
        if which == "token" or not known.known(digest):
            failures.refuse()
            if which == "address":
                # a tenant added since the last read is found by the next one: told when
                wait_s = min(wait_s, known.next_read_in_s())
            what = "this token" if which == "token" else "a wrong, revoked or expired token"
            raise HTTPException(429, f"too many requests with {what} from this address (at most {failures.limit} "
                                     f"a minute); retry after {wait_s} s",
                                headers={"Retry-After": str(wait_s), **UNAUTHORIZED})
    health = jobdb.health
    if health.down and (health.probing or known.keeping):
        # known down: answer now; no token is taken on trust meanwhile, so one revoked
        # elsewhere acts on nothing (issue 45)
        raise Unavailable(health)
    if health.down or not known.fresh():
        _read_first(known, jobdb, wait, force=health.down)
    tenant, why = known.tenant(digest)
    if tenant is None:
        if failures is not None:
            failures.failed(addr, digest)
        raise HTTPException(401, why, headers=UNAUTHORIZED)
    known.used(tenant["token_id"])
    return tenant


def _read_first(known: KnownTokens, jobdb, wait: bool, force: bool = False) -> None:
    """The token table read before a token is decided from it (never at the event loop:
    :class:`WouldWait`); 503 where the database cannot give it."""
    if not wait:
        raise WouldWait
    try:
        known.ensure_fresh(force)
    except Exception as e:
        if not is_unavailable(e):
            raise
        jobdb.health.failed(e)
        raise Unavailable(jobdb.health) from None
