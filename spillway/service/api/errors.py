"""How the API answers what went wrong: 503 with ``Retry-After`` while the job database is
unreachable (on a connection that stays open), 500 with one line for any other database
error, and 422 in FastAPI's own shape for bad values, naming the field."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from sqlalchemy.exc import DBAPIError, TimeoutError as PoolTimeout

from ..jobdb import is_unavailable
from ..jobdb.health import Unavailable
from .log_text import printable

logger = logging.getLogger("spillway.api")


def param_error(field: str, message: str) -> RequestValidationError:
    """A 422 in FastAPI's own shape, naming the field, so clients handle one error form."""
    return RequestValidationError([{"loc": ("body", *field.split(".")), "msg": message,
                                    "type": "value_error", "input": None}])


def unavailable(health) -> JSONResponse:
    """The 503 of a request that needs the job database while it is down."""
    since = health.as_dict()["down_since"]
    why = health.public_error or "no answer"  # never the driver's text: it names the database's address
    retry = health.retry_after_s()
    return JSONResponse({"detail": f"the job database is unreachable{f' since {since}' if since else ''} "
                                   f"({why}); retry after {retry} s", "retry_after_s": retry},
                        status_code=503, headers={"Retry-After": str(retry)})


# handled here (not by Starlette's last-resort 500, which also resets the keep-alive
# connection): the client gets 503 and can retry on the same connection
async def database_down(request: Request, exc: Unavailable):
    return unavailable(exc.health)


async def database_error(request: Request, exc: Exception):
    health = request.app.state.jobdb.health
    if is_unavailable(exc):
        health.failed(exc)
        return unavailable(health)
    logger.error("job database error on %s %s", request.method, printable(request.url.path), exc_info=exc)
    return JSONResponse({"detail": f"job database error ({type(exc).__name__}); the service's log has it"},
                        status_code=500)


def named(error: dict) -> dict:
    """One validation error as the API answers it. An unknown workflow is said as the
    catalogue says it (with the name it was likely meant to be) rather than as pydantic's
    list of every allowed name."""
    out = {k: v for k, v in error.items() if k in ("loc", "msg", "type")}
    name = error.get("input")
    # a name a person could have mistyped (a tenant may send megabytes, or a number)
    if (tuple(error.get("loc", ())) == ("body", "workflow") and error.get("type") == "literal_error"
            and isinstance(name, str) and 0 < len(name) <= 64 and name.isprintable()):
        from spillway import workflows
        from spillway.options.errors import ParamError

        try:
            workflows.get(name)
        except ParamError as e:
            # the field's name is the loc's: "workflow: 'transpose-summ' is unknown (...)"
            out["msg"] = str(e).removeprefix("workflow ")
    return out


async def validation_error(request: Request, exc: RequestValidationError):
    return JSONResponse({"detail": [named(e) for e in exc.errors()]}, status_code=422)


def allowed_methods(app, scope) -> set[str]:
    """Every method some route of ``app`` answers on the request's path (a path has a route
    per method: Starlette names only the first one's in ``Allow``, so ``OPTIONS /jobs`` said
    POST alone), asked of the routes themselves, included routers too."""
    from starlette.routing import Match

    methods: set[str] = set()
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        asked = {**scope, "method": method}
        if any(route.matches(asked)[0] == Match.FULL for route in app.router.routes):
            methods.add(method)
    return methods


async def method_not_allowed(request: Request, exc: StarletteHTTPException):
    """405 naming every method of the path; OPTIONS itself answered 204 with that ``Allow``."""
    if exc.status_code != 405:
        return await http_exception_handler(request, exc)
    methods = allowed_methods(request.app, request.scope)
    methods |= {"OPTIONS"} | ({"HEAD"} if "GET" in methods else set())
    allow = ", ".join(sorted(methods))
    if request.method == "OPTIONS":
        return Response(status_code=204, headers={"Allow": allow})
    return JSONResponse({"detail": exc.detail}, status_code=405, headers={"Allow": allow})


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``."""
    app.add_exception_handler(StarletteHTTPException, method_not_allowed)
    app.add_exception_handler(Unavailable, database_down)
    app.add_exception_handler(DBAPIError, database_error)
    app.add_exception_handler(PoolTimeout, database_error)
    app.add_exception_handler(RequestValidationError, validation_error)
