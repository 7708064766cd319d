"""Bearer-token authentication: a token names one tenant (or an admin).

Tokens expire (401 naming when) and are rotated by issuing the next before revoking the
last (:mod:`spillway.service.jobdb.tokens`). Each use is recorded at most once a minute.

Every request's token is checked against the job database; nothing is remembered. While
the database is down a token cannot be checked, so every request that needs a tenant
answers 503: a token revoked by ``spillway tenant revoke`` (another process, writing to the
database) must not act because it was valid before the outage (issue 45).
"""

from __future__ import annotations

from fastapi import HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..jobdb import is_unavailable
from ..jobdb.health import Unavailable

bearer = HTTPBearer(auto_error=False, description="A tenant token from `spillway tenant add` or `spillway tenant token`.")

UNAUTHORIZED = {"WWW-Authenticate": "Bearer"}


def current_tenant(request: Request, credentials: HTTPAuthorizationCredentials | None) -> dict:
    """The token's tenant; 401 with one line for a missing, unknown, revoked or expired
    token; 503 (:class:`Unavailable`) while the database cannot check it."""
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise HTTPException(401, "missing bearer token (Authorization: Bearer <token>)", headers=UNAUTHORIZED)
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
        raise HTTPException(401, why, headers=UNAUTHORIZED)
    try:
        jobdb.touch_token(tenant["token_id"])
    except Exception as e:  # a use not recorded is no reason to refuse the request
        if not is_unavailable(e):
            raise
    return tenant
