"""The HTTP API of the shared service.

Jobs are declarative: a registered workflow's name and parameters that validate against
its schema. Nothing a tenant sends is ever executed as code, and the Dask scheduler is not
reachable through the API. A tenant sees, cancels and reads only its own jobs (another
tenant's job is a 404, not a 403, so ids do not leak); an admin token sees all.

While the job database is unreachable every route that needs it answers 503 with
``Retry-After`` and a JSON ``detail`` (the connection stays open), ``/healthz`` says what is
down, and a cancel is still taken (202): a running job is stopped at once, a queued one
once the database answers. Request bodies are limited in size and time before anything
else runs (:mod:`.limits`).
"""


import logging
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from sqlalchemy.exc import DBAPIError, TimeoutError as PoolTimeout
from starlette.concurrency import run_in_threadpool

from spillway.cluster.errors import AdmissionError, ParamError
from spillway.cluster.sizes import format_bytes
from ..jobdb import is_unavailable
from ..jobdb.health import Unavailable
from . import schemas
from .auth import TokenCache, bearer, current_tenant
from .limits import OffLoopJSONRoute, RequestLimits, ServiceLimits
from .metrics import metrics_registry, metrics_response
from .web import router as web_router


def _tenant(request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]):
    return current_tenant(request, credentials)


def _tenant_outage_ok(request: Request,
                      credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]):
    return current_tenant(request, credentials, outage_ok=True)


Tenant = Annotated[dict, Depends(_tenant)]
#: for cancels, which are taken while the database is down from tokens valid lately
TenantOrRemembered = Annotated[dict, Depends(_tenant_outage_ok)]

logger = logging.getLogger("spillway.api")

NOT_FOUND = {404: {"description": "No such job for this tenant"}}
AUTH = {401: {"description": "Missing, invalid, revoked or expired token"},
        503: {"model": schemas.Unavailable, "description": "The job database is unreachable; retry after "
                                                              "the Retry-After header's seconds"}}


def _param_error(field: str, message: str) -> RequestValidationError:
    """A 422 in FastAPI's own shape, naming the field, so clients handle one error form."""
    return RequestValidationError([{"loc": ("body", *field.split(".")), "msg": message,
                                    "type": "value_error", "input": None}])


def _named(error: dict) -> dict:
    """One validation error as the API answers it. An unknown workflow is said as the
    catalogue says it (with the name it was likely meant to be) rather than as pydantic's
    list of every allowed name."""
    out = {k: v for k, v in error.items() if k in ("loc", "msg", "type")}
    name = error.get("input")
    # a name a person could have mistyped (a tenant may send megabytes, or a number)
    if (tuple(error.get("loc", ())) == ("body", "workflow") and error.get("type") == "literal_error"
            and isinstance(name, str) and 0 < len(name) <= 64 and name.isprintable()):
        from spillway import workflows

        try:
            workflows.get(name)
        except ParamError as e:
            # the field's name is the loc's: "workflow: 'transpose-summ' is unknown (...)"
            out["msg"] = str(e).removeprefix("workflow ")
    return out


def create_app(jobdb, queue, *, title: str = "spillway", limits: ServiceLimits | None = None) -> FastAPI:
    """The ASGI app over ``jobdb`` (a :class:`spillway.service.jobdb.JobDB`) and ``queue``
    (a :class:`spillway.service.jobs.JobQueue` bound to the cluster session)."""
    from spillway import workflows
    app = FastAPI(title=title, version="1", description=__doc__,
                  openapi_tags=[{"name": "jobs"}, {"name": "catalogue"}, {"name": "service"}])
    # before any route is added: every route parses its JSON body off the event loop
    app.router.route_class = OffLoopJSONRoute
    app.state.jobdb = jobdb
    app.state.queue = queue
    app.state.token_cache = TokenCache()
    app.state.limits = limits = limits or ServiceLimits()
    app.add_middleware(RequestLimits, limits=limits)
    JobRequest = schemas.job_request_model(workflows.names())
    registry = metrics_registry(jobdb, queue)
    health = jobdb.health

    def unavailable() -> JSONResponse:
        since = health.as_dict()["down_since"]
        why = health.error or "no answer"
        retry = health.retry_after_s()
        return JSONResponse({"detail": f"the job database is unreachable{f' since {since}' if since else ''} "
                                       f"({why}); retry after {retry} s", "retry_after_s": retry},
                            status_code=503, headers={"Retry-After": str(retry)})

    # handled here (not by Starlette's last-resort 500, which also resets the keep-alive
    # connection): the client gets 503 and can retry on the same connection
    @app.exception_handler(Unavailable)
    async def database_down(request: Request, exc: Unavailable):
        return unavailable()

    @app.exception_handler(DBAPIError)
    @app.exception_handler(PoolTimeout)
    async def database_error(request: Request, exc: Exception):
        if is_unavailable(exc):
            health.failed(exc)
            return unavailable()
        logger.error("job database error on %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"detail": f"job database error ({type(exc).__name__}); the service's log has it"},
                            status_code=500)

    def shown(job: dict) -> dict:
        """A job as the API answers it: with why it waits, while it is queued."""
        return {**job, "waiting": queue.waiting_reason(job)}

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        errors = [_named(e) for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.post("/jobs", response_model=schemas.Job, status_code=201, tags=["jobs"],
              responses={**AUTH, 400: {"description": "The body is not valid JSON"},
                         409: {"description": "The idempotency key names a job submitted with other values"},
                         200: {"model": schemas.Job,
                                       "description": "An earlier job with the same idempotency key"}})
    def submit(body: JobRequest, tenant: Tenant, response: Response,
               idempotency_key: Annotated[str | None, Header(min_length=1, max_length=128,
                                                             pattern=schemas.KEY_PATTERN)] = None):
        """Queue a job: a workflow's name and its parameters."""
        key = body.idempotency_key or idempotency_key
        try:
            footprint = queue.footprint(body.workflow, body.params, output=body.output)
        except AdmissionError as e:
            raise _param_error("params", str(e)) from None
        except ParamError as e:
            name, _, _ = str(e).partition(":")
            field = ("output" if name == "output" else f"params.{name}" if name and " " not in name
                     else "params")
            raise _param_error(field, str(e)) from None
        except Exception as e:  # noqa: BLE001 (a value no check foresaw is still the request's fault)
            logger.exception("validating a %s job", body.workflow)
            raise _param_error("params", f"params: cannot be validated ({type(e).__name__}: "
                                         f"{str(e)[:200]})") from None
        # no limit of its own: the tenant may submit what admission just accepted, and a
        # job past the cluster was refused above with the cluster's numbers
        limit = tenant["max_job_bytes"]
        if limit is not None and footprint > limit:
            raise _param_error("params", f"projected footprint {format_bytes(footprint)} exceeds this "
                                         f"tenant's limit of {format_bytes(limit)} per job (the cluster admits "
                                         f"{format_bytes(queue.tiers.total_bytes)})")
        job, created = jobdb.submit(tenant, workflow=body.workflow, params=body.params, verify=body.verify,
                                    priority=body.priority, idempotency_key=key, footprint_bytes=footprint,
                                    output=body.output)
        if created:
            queue.wake()
            return shown(job)
        asked = {"workflow": body.workflow, "params": body.params, "priority": body.priority,
                 "verify": body.verify, "output": body.output}
        if any(job[k] != v for k, v in asked.items()):
            raise HTTPException(409, f"idempotency_key: {key!r} already names job {job['id']}, "
                                     "submitted with other values")
        response.status_code = 200
        return shown(job)

    @app.get("/jobs", response_model=schemas.JobList, tags=["jobs"], responses=AUTH)
    def list_jobs(tenant: Tenant, query: Annotated[schemas.JobQuery, Query()]):
        """This tenant's jobs (every tenant's for an admin), newest first."""
        return {"jobs": [shown(j) for j in jobdb.jobs(tenant, state=query.state, limit=query.limit,
                                                      offset=query.offset)]}

    def _job(job_id: str, tenant: dict) -> dict:
        job = jobdb.job(job_id, tenant)
        if job is None:
            raise HTTPException(404, f"job {job_id!r} not found")
        return job

    @app.get("/jobs/{job_id}", response_model=schemas.Job, tags=["jobs"], responses={**AUTH, **NOT_FOUND})
    def get_job(job_id: str, tenant: Tenant):
        """State, progress, timings, bytes spilled and error of one job; while it is queued,
        why it waits."""
        return shown(_job(job_id, tenant))

    @app.post("/jobs/{job_id}/cancel", response_model=schemas.Job, tags=["jobs"],
              responses={**AUTH, **NOT_FOUND,
                         202: {"model": schemas.CancelAccepted,
                               "description": "Taken while the job database is unreachable"}})
    def cancel(job_id: str, tenant: TenantOrRemembered):
        """Cancel a job: a queued one at once; a running one has its tasks stopped and its
        memory freed (its state turns cancelled when that is done). Finished jobs stay.
        While the job database is unreachable the cancel is still taken (202): a running
        job stops at once, and the cancel is recorded when the database answers."""
        if health.down and health.probing:
            return _cancel_offline(job_id, tenant)
        try:
            job = jobdb.request_cancel(job_id, tenant)
        except Exception as e:
            if not is_unavailable(e):
                raise
            health.failed(e)
            return _cancel_offline(job_id, tenant)
        if job is None:
            raise HTTPException(404, f"job {job_id!r} not found")
        if job["state"] == "running" and job["cancel_requested"]:
            queue.request_cancel(job_id, tenant)  # now, not at the runner's next look
        return shown(job)

    def _cancel_offline(job_id: str, tenant: dict) -> JSONResponse:
        running = queue.request_cancel(job_id, tenant)
        if running is not None:
            detail = ("cancel taken while the job database is unreachable: the job's tasks are being "
                      "stopped; it is recorded cancelled when the database answers")
        else:
            queue.defer_cancel(job_id, tenant)
            detail = ("cancel taken while the job database is unreachable: it applies to this job, if it is "
                      "yours and still queued, when the database answers, before any queued job starts")
        body = {"id": job_id, "state": running["state"] if running else None, "cancel_requested": True,
                "detail": detail}
        return JSONResponse(jsonable_encoder(body), status_code=202,
                            headers={"Retry-After": str(health.retry_after_s())})

    @app.get("/jobs/{job_id}/result", response_model=schemas.JobResult, tags=["jobs"],
             responses={**AUTH, **NOT_FOUND, 409: {"description": "The job has not finished"}})
    def result(job_id: str, tenant: Tenant):
        """The result summary and run report of a finished job, and where its Zarr output is."""
        job = _job(job_id, tenant)
        report = jobdb.report(job_id)
        if report is None:
            raise HTTPException(409, f"job {job_id} is {job['state']}; a result exists once it is done")
        return {"id": job_id, "state": job["state"], "summary": report.get("result") or {},
                "output": report.get("output"), "report": report}

    @app.get("/jobs/{job_id}/logs", response_model=schemas.JobLogs, tags=["jobs"],
             responses={**AUTH, **NOT_FOUND})
    def logs(job_id: str, tenant: Tenant):
        """What happened to the job, line by line."""
        _job(job_id, tenant)
        return {"id": job_id, "lines": jobdb.logs(job_id)}

    @app.get("/workflows", response_model=list[schemas.Workflow], tags=["catalogue"], responses=AUTH)
    def catalogue(tenant: Tenant) -> list[dict[str, Any]]:
        """The workflow catalogue with each workflow's parameter schema (defaults for this cluster)."""
        return workflows.catalogue(queue.target)

    @app.get("/healthz", response_model=schemas.Health, tags=["service"],
             responses={503: {"model": schemas.Health, "description": "Something is down: `down` names it"}})
    async def healthz():
        """Liveness: whether the job database answers and the cluster's client is up; 503
        naming what is down. Answered from the service's last look (the database is
        probed every 2 s, every 0.5 s while down), never by waiting on the database."""
        if health.checked is None:  # no probe thread (an app without a started job queue)
            await run_in_threadpool(health.probe_once)
        down = []
        if health.down:
            down.append("database")
        client_status = getattr(queue.session.client, "status", "running")
        if client_status not in ("running", "connecting", "newly-created"):
            down.append("cluster")
        counts = None if health.down else health.counts
        body = {"status": "degraded" if down else "ok", "down": down, "kind": queue.session.kind,
                "workers": queue.session.n_workers,
                "queued": counts["queued"] if counts else None, "running": counts["running"] if counts else None,
                "database": {**health.as_dict(), "backend": jobdb.engine.dialect.name},
                "cluster": {"ok": "cluster" not in down, "status": str(client_status)}}
        if down:
            return JSONResponse(body, status_code=503, headers={"Retry-After": str(health.retry_after_s())})
        return body

    @app.get("/metrics", tags=["service"], response_class=Response,
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"},
                        503: AUTH[503]})
    def metrics():
        """Prometheus metrics: queue depth, jobs by state, worker memory, bytes each tier holds
        (device, host, disk), spilled bytes."""
        if health.down and health.probing:
            raise Unavailable(health)
        return metrics_response(registry)

    app.include_router(web_router)
    return app
