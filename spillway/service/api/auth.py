"""Bearer-token authentication: a token names one tenant (or an admin).

Tokens expire (401 naming when) and are rotated by issuing the next before revoking the
last (:mod:`spillway.service.jobdb.tokens`). Each use is recorded at most once a minute.

Every request's token is checked against the job database; nothing is remembered. While
the database is down a token cannot be checked, so every request that needs a tenant
answers 503: a token revoked by ``spillway tenant revoke`` (another process, writing to the
database) must not act because it was valid before the outage (issue 45).

A request is authenticated from its headers before anything reads its body
(:class:`~.gate.Authenticate`): a request without a valid token costs the service a header
and a digest, never the parse of its body (issue 74: a 640 KB body of 60,000 keys without a
token was parsed, and answered 422). A missing token counts as a failure, as a wrong one does.

An address whose tokens failed ``--max-auth-failures`` times in the last minute gets 429
with ``Retry-After`` for the next token the service does not know (:class:`AuthFailures`,
issue 53: a bad token cost a database lookup, 235 a second, with no limit). Which tokens may
be valid is known without asking the database for each (:class:`KnownTokens`: the digests
of the live tokens, read at most every few seconds), so a valid tenant behind that address
is looked up and served, whether or not it was seen since the start (issue 74: the
protection covered only tokens seen since start, and none after a restart). A token that
keeps failing from an address (a revoked one a client is stuck on) is held back by its own
count there.
"""

from __future__ import annotations

import collections
import math
import threading
import time

from fastapi import HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..jobdb import is_unavailable
from ..jobdb.health import Unavailable
from ..jobdb.rows import hash_token

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


class KnownTokens:
    """The digests of the tokens that may be valid now (neither they nor their tenant
    revoked, not expired), read from the job database at most every ``refresh_s``, so
    that a request from an address held back for failures is looked up only where its
    token is one of them: one read a few seconds at most, however many guesses. The
    database still decides each token (a revoke since the last read is seen at its
    lookup); a token added since is found by the next read."""

    def __init__(self, jobdb, refresh_s: float = 2.0):
        self.jobdb = jobdb
        self.refresh_s = refresh_s
        self._digests: frozenset[str] = frozenset()
        self._read_at = -math.inf
        self._lock = threading.Lock()
        self._reading = False

    def known(self, digest: str) -> bool:
        """Whether ``digest`` is a live token's, the tokens read again first where the last
        read is older than ``refresh_s`` (this thread waits on it: call it off the event
        loop)."""
        if time.monotonic() - self._read_at < self.refresh_s:
            return digest in self._digests
        with self._lock:
            if time.monotonic() - self._read_at >= self.refresh_s:
                self._read()
            return digest in self._digests

    def known_now(self, digest: str) -> bool:
        """Whether ``digest`` is a live token's as of the last read, without waiting on the
        database (for ``/healthz``): a stale or missing read is started in a thread of
        its own, for the next caller."""
        if time.monotonic() - self._read_at >= self.refresh_s and not self._reading:
            self._reading = True
            threading.Thread(target=self._read_locked, name="spillway-known-tokens", daemon=True).start()
        return digest in self._digests

    def next_read_in_s(self) -> int:
        """Whole seconds (at least 1) until an unknown token may have the tokens read again."""
        return max(1, math.ceil(self._read_at + self.refresh_s - time.monotonic()))

    def refresh(self) -> None:
        """Read the live tokens now (``spillway serve`` at start, so the first requests
        find them)."""
        with self._lock:
            self._read()

    def _read_locked(self):
        try:
            with self._lock:
                self._read()
        except Exception:  # noqa: BLE001 (the database down: the next caller tries again)
            pass
        finally:
            self._reading = False

    def _read(self):
        self._digests = frozenset(self.jobdb.live_token_digests())
        self._read_at = time.monotonic()


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


def current_tenant(request: Request, credentials: HTTPAuthorizationCredentials | None = None) -> dict:
    """The token's tenant; 401 with one line for a missing, unknown, revoked or expired
    token; 429 for an address (or a token at it) past ``--max-auth-failures`` whose token
    is not a live one; 503 (:class:`Unavailable`) while the database cannot check it.
    ``credentials``: FastAPI's reading of the header, where a route has it; the header
    itself otherwise."""
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
    digest = hash_token(token)
    held = failures.held_back(addr, digest) if failures is not None else None
    if held is not None:
        wait, which = held
        known: KnownTokens | None = getattr(request.app.state, "known_tokens", None)
        # a valid tenant behind an address that others' failures hold back is served: only a
        # token that is no live one waits, and finding that out costs no lookup of its own
        if which == "token" or known is None or not _known(known, digest, request):
            failures.refuse()
            if which == "address" and known is not None:
                # a tenant added since the last read is found by the next one: told when
                wait = min(wait, known.next_read_in_s())
            what = "this token" if which == "token" else "a wrong, revoked or expired token"
            raise HTTPException(429, f"too many requests with {what} from this address (at most {failures.limit} "
                                     f"a minute); retry after {wait} s",
                                headers={"Retry-After": str(wait), **UNAUTHORIZED})
    jobdb = request.app.state.jobdb
    if jobdb.health.down and jobdb.health.probing:
        # known down: answer now rather than queue behind connection attempts
        raise Unavailable(jobdb.health)
    try:
        tenant, why = jobdb.authenticate(token)
    except Exception as e:
        if not is_unavailable(e):
            raise
        jobdb.health.failed(e)
        raise Unavailable(jobdb.health) from None
    jobdb.health.ok()  # it answered (for an app whose probe is not running)
    if tenant is None:
        if failures is not None:
            failures.failed(addr, digest)
        raise HTTPException(401, why, headers=UNAUTHORIZED)
    try:
        jobdb.touch_token(tenant["token_id"])
    except Exception as e:  # a use not recorded is no reason to refuse the request
        if not is_unavailable(e):
            raise
    return tenant


def _known(known: KnownTokens, digest: str, request: Request) -> bool:
    try:
        return known.known(digest)
    except Exception as e:
        if not is_unavailable(e):
            raise
        request.app.state.jobdb.health.failed(e)
        raise Unavailable(request.app.state.jobdb.health) from None
