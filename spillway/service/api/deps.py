"""What a route is handed: the service's job database and queue (from the app's state),
and the tenant of the request's token."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials

from .auth import bearer, current_tenant


def jobdb(request: Request):
    """The app's :class:`spillway.service.jobdb.JobDB`."""
    return request.app.state.jobdb


def queue(request: Request):
    """The app's :class:`spillway.service.jobs.JobQueue`."""
    return request.app.state.queue


def _tenant(request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]):
    # authenticated before the body was read (:mod:`.gate`); looked up here only in an app
    # without that middleware
    tenant = request.scope.get("spillway.tenant")
    return tenant if tenant is not None else current_tenant(request, credentials)


JobDB = Annotated[object, Depends(jobdb)]
Queue = Annotated[object, Depends(queue)]
Tenant = Annotated[dict, Depends(_tenant)]
