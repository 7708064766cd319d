"""Bearer-token authentication: a token names one tenant (or an admin).

Tokens expire (401 naming when) and are rotated by issuing the next before revoking the
last (:mod:`spillway.service.jobdb.tokens`). Each use is recorded at most once a minute.
Tokens that authenticated lately are remembered in memory (by digest) only so that a
cancel can still be taken while the job database is down; every other request then
answers 503.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import datetime, timezone

from fastapi import HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..jobdb import hash_token, is_unavailable
from ..jobdb.health import Unavailable

bearer = HTTPBearer(auto_error=False, description="A tenant token from `spillway tenant add` or `spillway tenant token`.")

UNAUTHORIZED = {"WWW-Authenticate": "Bearer"}


class TokenCache:
    """Tenants of recently valid tokens, by digest, at most ``size`` of them."""

    def __init__(self, size: int = 10_000):
        self.size = size
        self._items: OrderedDict[str, dict] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, digest: str, tenant: dict):
        with self._lock:
            self._items[digest] = tenant
            self._items.move_to_end(digest)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get(self, digest: str) -> dict | None:
        with self._lock:
            return self._items.get(digest)

    def drop(self, digest: str):
        with self._lock:
            self._items.pop(digest, None)


def current_tenant(request: Request, credentials: HTTPAuthorizationCredentials | None, *,
                   outage_ok: bool = False) -> dict:
    """The token's tenant; 401 with one line for a missing, unknown, revoked or expired
    token; 503 while the database is down (unless ``outage_ok`` and the token was valid
    lately)."""
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise HTTPException(401, "missing bearer token (Authorization: Bearer <token>)", headers=UNAUTHORIZED)
    jobdb = request.app.state.jobdb
    cache: TokenCache = request.app.state.token_cache
    digest = hash_token(credentials.credentials)
    if jobdb.health.down and jobdb.health.probing:
        # known down: answer now rather than queue behind connection attempts
        return _cached(cache, digest, jobdb.health, outage_ok)
    try:
        tenant, why = jobdb.authenticate(credentials.credentials)
    except Exception as e:
        if not is_unavailable(e):
            raise
        jobdb.health.failed(e)
        return _cached(cache, digest, jobdb.health, outage_ok)
    jobdb.health.ok()  # it answered (for an app whose probe is not running)
    if tenant is None:
        cache.drop(digest)
        raise HTTPException(401, why, headers=UNAUTHORIZED)
    cache.put(digest, tenant)
    try:
        jobdb.touch_token(tenant["token_id"])
    except Exception as e:  # a use not recorded is no reason to refuse the request
        if not is_unavailable(e):
            raise
    return tenant


def _cached(cache: TokenCache, digest: str, health, outage_ok: bool) -> dict:
    tenant = cache.get(digest) if outage_ok else None
    if tenant is None:
        raise Unavailable(health)
    expires = tenant.get("token_expires")
    if expires is not None and expires <= datetime.now(timezone.utc):
        raise HTTPException(401, f"token expired at {expires.isoformat(timespec='seconds')}", headers=UNAUTHORIZED)
    return tenant
