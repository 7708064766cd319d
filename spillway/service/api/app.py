"""The HTTP API of the shared service.

Jobs are declarative: a registered workflow's name and parameters that validate against
its schema. Nothing a tenant sends is ever executed as code, and the Dask scheduler is not
reachable through the API. A tenant sees, cancels and reads only its own jobs (another
tenant's job is a 404, not a 403, so ids do not leak); an admin token sees all.

While the job database is unreachable every route that needs it answers 503 with
``Retry-After`` and a JSON ``detail`` (the connection stays open), and ``/healthz`` says
what is down; no token is taken on trust meanwhile, so a revoked one acts on nothing.
A request to any route that needs a token is authenticated from its headers before its
body is read (:mod:`.gate`); request bodies are then limited in size and time before
anything else runs (:mod:`.limits`), and a client's connections in number and in the time
to send headers before that (:mod:`.connections`).
"""

import contextlib

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from . import catalogue, errors, health, jobs, log_text, metrics
from .auth import AuthFailures, KnownTokens
from .connections import ConnectionStats
from .gate import Authenticate
from .limits import BodyStats, RequestLimits
from .settings import ServiceLimits
from .web import router as web_router


def create_app(jobdb, queue, *, title: str = "spillway", limits: ServiceLimits | None = None,
               connections: ConnectionStats | None = None) -> FastAPI:
    """The ASGI app over ``jobdb`` (a :class:`spillway.service.jobdb.JobDB`) and ``queue``
    (a :class:`spillway.service.jobs.JobQueue` bound to the cluster session). The routes
    live in modules named for what they serve: :mod:`.jobs`, :mod:`.catalogue`,
    :mod:`.health`, :mod:`.metrics` and :mod:`.web`; the answers to errors in :mod:`.errors`.
    ``connections``: the counts of the server's connection guard (:mod:`.connections`), for
    ``/metrics``."""
    app = FastAPI(title=title, version="1", description=__doc__, docs_url=None, redoc_url=None,
                  openapi_tags=[{"name": "jobs"}, {"name": "catalogue"}, {"name": "service"}], lifespan=_lifespan)
    _local_docs(app)
    app.state.jobdb = jobdb
    app.state.queue = queue
    app.state.limits = limits = limits or ServiceLimits()
    app.state.body_stats = body_stats = BodyStats()
    app.state.metrics_registry = metrics.metrics_registry(jobdb, queue, connections, body_stats)
    app.state.auth_failures = AuthFailures(limits.max_auth_failures)
    app.state.known_tokens = KnownTokens(jobdb)
    app.add_middleware(RequestLimits, limits=limits, stats=body_stats)
    # added last, so outermost: a token is checked before the body limits read any body
    app.add_middleware(Authenticate, app_routes=app, max_request_bytes=limits.max_request_bytes)
    errors.install(app)
    log_text.install()
    for module in (jobs, catalogue, health, metrics):
        app.include_router(module.router)
    app.include_router(web_router)
    return app


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI):
    yield
    # the server stops: the token reader too, its last uses recorded (before the database closes)
    await run_in_threadpool(app.state.known_tokens.stop)


def _local_docs(app: FastAPI) -> None:
    """``/docs`` from Swagger UI's files as the service's own (the ``swagger-ui-bundle``
    package), never from a CDN: a page that loads scripts from elsewhere runs them with the
    token a tenant types in. Without the package there is no ``/docs``; ``/openapi.json``
    stays."""
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:
        return
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles

    app.mount("/docs-assets", StaticFiles(directory=swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs():
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} API",
                                   swagger_js_url="/docs-assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs-assets/swagger-ui.css",
                                   swagger_favicon_url="/docs-assets/favicon-32x32.png")
