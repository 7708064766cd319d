"""Authentication before the body: :class:`Authenticate`, pure ASGI middleware outermost
in the app, answers a request to any route that takes a tenant from its headers alone,
before the body limits (:mod:`.limits`) read its body and before FastAPI parses it. A
request without a valid token gets its 401 (or 429, or 503 while the database cannot
check it) having sent only its headers; its body, if any, is never read, and the
connection is closed so that it cannot carry another request. The token is decided from
the tokens the service holds in memory (:class:`~.auth.KnownTokens`), on the event loop:
no query and no thread per request. The tenant found is handed to the route
(``scope["spillway.tenant"]``), which looks nothing up again."""

from __future__ import annotations

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, TimeoutError as PoolTimeout
from starlette.concurrency import run_in_threadpool
from starlette.routing import Match

from ..jobdb import is_unavailable
from ..jobdb.health import Unavailable
from .auth import WouldWait, current_tenant
from .errors import unavailable

#: where the tenant of an authenticated request waits for its route
TENANT_KEY = "spillway.tenant"


def takes_tenant(route) -> bool:
    """Whether ``route`` (a FastAPI route) depends, at any depth, on the request's tenant."""
    from .deps import _tenant

    dependant = getattr(route, "dependant", None)
    stack = [dependant] if dependant is not None else []
    while stack:
        d = stack.pop()
        if d.call is _tenant:
            return True
        stack.extend(d.dependencies)
    return False


def leaf_routes(routes):
    """The routes themselves, those of included routers too (FastAPI keeps an included
    router as one entry that dispatches to its own; the service includes its routers
    without a prefix, so their routes match the request's own path)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from leaf_routes(included.routes)
        else:
            yield route


class Authenticate:
    """Authenticates the requests of the routes that take a tenant, before their bodies
    are read (module docstring). ``app_routes``: the FastAPI app, whose routes are asked
    which need a token (once, at the first request: every route is added by then)."""

    def __init__(self, app, app_routes, max_request_bytes: int | None = None):
        self.app = app
        self.app_routes = app_routes
        self.max_request_bytes = max_request_bytes
        self._routes: list | None = None

    def _needs_token(self, scope) -> bool:
        if self._routes is None:
            self._routes = [r for r in leaf_routes(self.app_routes.router.routes) if takes_tenant(r)]
        return any(route.matches(scope)[0] == Match.FULL for route in self._routes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self._needs_token(scope) or self._declared_too_large(scope):
            # a declared size past the limit is refused (413) from the headers alone by the
            # body limits, as cheaply as a 401 and more telling
            return await self.app(scope, receive, send)
        request = Request(scope)  # headers only: no receive, so nothing can read the body
        try:
            try:
                # from the tokens in memory, on the event loop: no query, no thread
                tenant = current_tenant(request, wait=False)
            except WouldWait:  # the token table must be read first, which waits on the database
                tenant = await run_in_threadpool(current_tenant, request)
        except HTTPException as e:
            response = JSONResponse({"detail": e.detail}, status_code=e.status_code, headers=e.headers)
        except Unavailable as e:
            response = unavailable(e.health)
        except (DBAPIError, PoolTimeout) as e:
            health = self.app_routes.state.jobdb.health
            if not is_unavailable(e):
                raise
            health.failed(e)
            response = unavailable(health)
        else:
            scope[TENANT_KEY] = tenant
            return await self.app(scope, receive, send)
        if _has_body(scope):
            # its body is left unread on the connection: the connection cannot carry another request
            response.headers["connection"] = "close"
        await response(scope, receive, send)


    def _declared_too_large(self, scope) -> bool:
        if self.max_request_bytes is None:
            return False
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    return int(value) > self.max_request_bytes
                except ValueError:
                    return False
        return False


def _has_body(scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-length" and value.strip() not in (b"0", b""):
            return True
        if name == b"transfer-encoding":
            return True
    return False
