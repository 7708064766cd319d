"""Bearer-token authentication: a token names one tenant (or an admin)."""

from __future__ import annotations

from fastapi import HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

bearer = HTTPBearer(auto_error=False, description="A tenant token from `spillway tenant add`.")

UNAUTHORIZED = {"WWW-Authenticate": "Bearer"}


def current_tenant(request: Request, credentials: HTTPAuthorizationCredentials | None) -> dict:
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise HTTPException(401, "missing bearer token (Authorization: Bearer <token>)", headers=UNAUTHORIZED)
    tenant = request.app.state.jobdb.tenant_for_token(credentials.credentials)
    if tenant is None:
        raise HTTPException(401, "invalid or revoked token", headers=UNAUTHORIZED)
    return tenant
