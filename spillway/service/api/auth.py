"""Bearer-token authentication: a token names one tenant (or an admin).

Tokens expire (401 naming when) and are rotated by issuing the next before revoking the
last (:mod:`spillway.service.jobdb.tokens`). Each use is recorded at most once a minute.

Every request's token is checked against the job database; nothing is remembered. While
the database is down a token cannot be checked, so every request that needs a tenant
answers 503: a token revoked by ``spillway tenant revoke`` (another process, writing to the
database) must not act because it was valid before the outage (issue 45).

An address whose tokens failed ``--max-auth-failures`` times in the last minute gets 429
with ``Retry-After`` before its next token is looked up (:class:`AuthFailures`, issue 53:
a bad token cost a database lookup, 235 a second, with no limit), except for tokens that
have authenticated before, which are limited per token prefix instead (issue 63: 2,000
bad tokens from one address locked out every tenant behind it).
"""

from __future__ import annotations

import collections
import hashlib
import math
import threading
import time

from fastapi import HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..jobdb import is_unavailable
from ..jobdb.health import Unavailable

bearer = HTTPBearer(auto_error=False, description="A tenant token from `spillway tenant add` or `spillway tenant token`.")

UNAUTHORIZED = {"WWW-Authenticate": "Bearer"}


#: characters of a token that name it in the books of failures (its random part begins
#: after ``spw_``): enough to tell tenants apart, far too few to stand for the token
PREFIX_CHARS = 16


def token_prefix(token: str) -> bytes:
    """What the books keep of a token: a digest of its first characters, never the token."""
    return hashlib.sha256(token[:PREFIX_CHARS].encode("utf-8", "surrogatepass")).digest()[:12]


class AuthFailures:
    """Failed token checks over the last ``window_s`` seconds, per client address and per
    token prefix at that address: past ``limit`` either way the request gets 429 with
    ``Retry-After`` before its token is looked up, so guessing tokens (or a client stuck on
    a revoked one) costs the database nothing.

    An address held back for its failures still has tokens looked up whose prefix has
    authenticated before (:meth:`succeeded`), each within its own prefix's limit at that
    address: one bad client behind a NAT, or a guesser there, does not lock out the tenants
    that share its address. Holds at most ``max_keys`` addresses, prefixes and good
    prefixes each (the quietest go first)."""

    def __init__(self, limit: int, window_s: float = 60.0, max_keys: int = 65536):
        self.limit = limit
        self.window_s = window_s
        self.max_keys = max_keys
        self._failures: collections.OrderedDict[tuple, collections.deque] = collections.OrderedDict()
        self._good: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.refused = 0

    def held_back(self, addr: str, token: str = "") -> tuple[int, str] | None:
        """(seconds until it may try again, "token" or "address") for a request from
        ``addr`` with ``token``, or None where its token may be looked up now."""
        prefix = token_prefix(token)
        now = time.monotonic()
        with self._lock:
            wait = self._wait(("token", addr, prefix), now)
            if wait is not None:
                self.refused += 1
                return wait, "token"
            if prefix in self._good:
                return None
            wait = self._wait(("address", addr), now)
            if wait is not None:
                self.refused += 1
                return wait, "address"
            return None

    def retry_after_s(self, addr: str, token: str = "") -> int | None:
        held = self.held_back(addr, token)
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

    def failed(self, addr: str, token: str = "") -> None:
        now = time.monotonic()
        with self._lock:
            for key in (("address", addr), ("token", addr, token_prefix(token))):
                times = self._failures.pop(key, None) or collections.deque(maxlen=self.limit)
                times.append(now)
                self._failures[key] = times  # the most recent last
            while len(self._failures) > 2 * self.max_keys:
                self._failures.popitem(last=False)

    def succeeded(self, token: str) -> None:
        """``token`` named a tenant: its prefix is looked up even from an address held back."""
        prefix = token_prefix(token)
        with self._lock:
            self._good.pop(prefix, None)
            self._good[prefix] = None
            while len(self._good) > self.max_keys:
                self._good.popitem(last=False)


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


def current_tenant(request: Request, credentials: HTTPAuthorizationCredentials | None) -> dict:
    """The token's tenant; 401 with one line for a missing, unknown, revoked or expired
    token; 503 (:class:`Unavailable`) while the database cannot check it."""
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise HTTPException(401, "missing bearer token (Authorization: Bearer <token>)", headers=UNAUTHORIZED)
    failures: AuthFailures | None = getattr(request.app.state, "auth_failures", None)
    addr = client_address(request)
    token = credentials.credentials
    held = failures.held_back(addr, token) if failures is not None else None
    if held is not None:
        wait, which = held
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
            failures.failed(addr, token)
        raise HTTPException(401, why, headers=UNAUTHORIZED)
    if failures is not None:
        failures.succeeded(token)
    try:
        jobdb.touch_token(tenant["token_id"])
    except Exception as e:  # a use not recorded is no reason to refuse the request
        if not is_unavailable(e):
            raise
    return tenant
