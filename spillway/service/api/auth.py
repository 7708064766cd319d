"""Bearer-token authentication: a token names one tenant (or an admin).

Tokens expire (401 naming when) and are rotated by issuing the next before revoking the
last (:mod:`spillway.service.jobdb.tokens`). Each use is recorded at most once a minute.

Every request's token is checked against the job database; nothing is remembered. While
the database is down a token cannot be checked, so every request that needs a tenant
answers 503: a token revoked by ``spillway tenant revoke`` (another process, writing to the
database) must not act because it was valid before the outage (issue 45).

An address whose tokens failed ``--max-auth-failures`` times in the last minute gets 429
with ``Retry-After`` before its next token is looked up (:class:`AuthFailures`, issue 53:
a bad token cost a database lookup, 235 a second, with no limit).
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

bearer = HTTPBearer(auto_error=False, description="A tenant token from `spillway tenant add` or `spillway tenant token`.")

UNAUTHORIZED = {"WWW-Authenticate": "Bearer"}


class AuthFailures:
    """Failed token checks per client address over the last ``window_s`` seconds: past
    ``limit`` the address gets 429 with ``Retry-After`` before its token is looked up, so
    guessing tokens (or a client stuck on a revoked one) costs the database nothing. Holds
    at most ``max_addresses`` addresses (the quietest go first)."""

    def __init__(self, limit: int, window_s: float = 60.0, max_addresses: int = 65536):
        self.limit = limit
        self.window_s = window_s
        self.max_addresses = max_addresses
        self._failures: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.refused = 0

    def retry_after_s(self, addr: str) -> int | None:
        """Seconds until ``addr`` may try a token again, or None where it may now."""
        now = time.monotonic()
        with self._lock:
            times = self._failures.get(addr)
            if times is None:
                return None
            while times and times[0] <= now - self.window_s:
                times.popleft()
            if len(times) < self.limit:
                return None
            self.refused += 1
            return max(1, math.ceil(times[0] + self.window_s - now))

    def failed(self, addr: str) -> None:
        with self._lock:
            times = self._failures.pop(addr, None) or collections.deque(maxlen=self.limit)
            times.append(time.monotonic())
            self._failures[addr] = times  # the most recent last
            while len(self._failures) > self.max_addresses:
                self._failures.popitem(last=False)


def client_address(request: Request) -> str:
    """The client's address (a trusted proxy's X-Forwarded-For already applied by uvicorn)."""
    return request.client.host if request.client else "unknown"


def current_tenant(request: Request, credentials: HTTPAuthorizationCredentials | None) -> dict:
    """The token's tenant; 401 with one line for a missing, unknown, revoked or expired
    token; 503 (:class:`Unavailable`) while the database cannot check it."""
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise HTTPException(401, "missing bearer token (Authorization: Bearer <token>)", headers=UNAUTHORIZED)
    failures: AuthFailures | None = getattr(request.app.state, "auth_failures", None)
    addr = client_address(request)
    wait = failures.retry_after_s(addr) if failures is not None else None
    if wait is not None:
        raise HTTPException(429, f"too many requests with a wrong, revoked or expired token from this address "
                                 f"(at most {failures.limit} a minute); retry after {wait} s",
                            headers={"Retry-After": str(wait), **UNAUTHORIZED})
    jobdb = request.app.state.jobdb
    if jobdb.health.down and jobdb.health.probing:
        # known down: answer now rather than queue behind connection attempts
        raise Unavailable(jobdb.health)
    try:
        tenant, why = jobdb.authenticate(credentials.credentials)
    except Exception as e:
        if not is_unavailable(e):
            raise
        jobdb.health.failed(e)
        raise Unavailable(jobdb.health) from None
    jobdb.health.ok()  # it answered (for an app whose probe is not running)
    if tenant is None:
        if failures is not None:
            failures.failed(addr)
        raise HTTPException(401, why, headers=UNAUTHORIZED)
    try:
        jobdb.touch_token(tenant["token_id"])
    except Exception as e:  # a use not recorded is no reason to refuse the request
        if not is_unavailable(e):
            raise
    return tenant
