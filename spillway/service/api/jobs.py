"""The jobs routes: submit, list, one job's state, cancel, result and log.

A tenant sees, cancels and reads only its own jobs (another tenant's job is a 404, not a
403, so ids do not leak); an admin token sees all.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Path, Query, Request, Response
from fastapi.responses import JSONResponse

from spillway import workflows
from spillway.options.errors import AdmissionError, ParamError
from spillway.options.sizes import format_bytes
from ..jobdb import CLUSTER_JOB_BYTES, QuotaExceeded
from . import schemas
from .auth import from_this_machine
from .deps import JobDB, Queue, Tenant
from .errors import param_error
from .limits import OffLoopJSONRoute, refusal

logger = logging.getLogger("spillway.api")

#: seconds a submission refused for an unreachable cluster is told to wait before trying again
CLUSTER_RETRY_AFTER_S = 5

NOT_FOUND = {404: {"description": "No such job for this tenant"}}
AUTH = {401: {"description": "Missing, invalid, revoked or expired token"},
        429: {"description": "Too many wrong, revoked or expired tokens from this address in the last minute "
                             "(--max-auth-failures); retry after the Retry-After header's seconds"},
        503: {"model": schemas.Unavailable, "description": "The job database is unreachable; retry after "
                                                              "the Retry-After header's seconds"}}

#: each workflow's parameter names: what a job's ``params`` may hold, published in the
#: schema of POST /jobs and enforced before validation (:func:`known_params`)
PARAM_NAMES = {name: frozenset(p.name for p in workflows.get(name).params) for name in workflows.names()}

#: the body of POST /jobs, its workflow an enum of the catalogue's names
JobRequest = schemas.job_request_model(workflows.names(), {k: sorted(v) for k, v in PARAM_NAMES.items()})


def known_params(document) -> None:
    """A submission's ``params`` refused before validation where it holds more keys than its
    workflow has parameters, or a key that names none of them: in time bounded by the
    workflow's own parameters, whatever the body holds (a body of 60,000 unknown keys took
    5 s of the API's time to be refused). A body this check cannot read (no such workflow,
    params not an object) is left to validation, which says why."""
    if not isinstance(document, dict) or not isinstance(document.get("params"), dict):
        return
    name, params = document.get("workflow"), document["params"]
    names = PARAM_NAMES.get(name) if isinstance(name, str) else None
    if names is None:
        names = ALL_PARAM_NAMES
        if len(params) > len(names):
            raise refusal("params", f"params: {len(params)} keys, more than the {len(names)} parameter names "
                                    "of every workflow together")
        return
    if len(params) > len(names):
        raise refusal("params", f"params: {len(params)} keys, more than the {len(names)} parameters of {name} "
                                f"({', '.join(sorted(names))})")
    spec = workflows.get(name)
    unknown = spec.first_unknown(params)
    if unknown is not None:
        error = str(spec.unknown_key(unknown))
        raise refusal(f"params.{unknown}" if unknown and len(unknown) <= 64 and unknown.isprintable()
                      and "." not in unknown else "params", error)


ALL_PARAM_NAMES = frozenset().union(*PARAM_NAMES.values())


class JobsRoute(OffLoopJSONRoute):
    body_checks = (known_params,)


router = APIRouter(tags=["jobs"], route_class=JobsRoute)

#: a job id in a path: 32 hex digits, checked before anything reads the database (a NUL
#: byte there was a 500 from PostgreSQL)
JobId = Annotated[str, Path(pattern=schemas.JOB_ID_PATTERN, description="A job's id: 32 hex digits.")]


def shown(queue, job: dict) -> dict:
    """A job as the API answers it: with why it waits, while it is queued."""
    return {**job, "waiting": queue.waiting_reason(job)}


def _job(jobdb, job_id: str, tenant: dict) -> dict:
    job = jobdb.job(job_id, tenant)
    if job is None:
        raise HTTPException(404, f"job {job_id!r} not found")
    return job


#: what a 429 past the queue quota tells clients to wait: a queued job of a small tenant
#: starts within seconds of its turn, and a flood retried sooner only costs a count each
QUOTA_RETRY_AFTER_S = 10


def quota_refusal(e: Exception) -> HTTPException:
    """The 429 of a submission past its tenant's queue quota, with ``Retry-After``."""
    return HTTPException(429, str(e), headers={"Retry-After": str(QUOTA_RETRY_AFTER_S)})


@router.post("/jobs", response_model=schemas.Job, status_code=201,
             responses={**AUTH, 400: {"description": "The body is not valid JSON"},
                        409: {"description": "The idempotency key names a job submitted with other values"},
                        429: {"description": "The tenant has its quota of jobs queued (max-queued)"},
                        503: {"model": schemas.Unavailable,
                              "description": "The job database, or the cluster a job is sized on, is "
                                             "unreachable; retry after the Retry-After header's seconds"},
                        200: {"model": schemas.Job, "description": "An earlier job with the same idempotency key"}})
def submit(body: JobRequest, tenant: Tenant, response: Response, jobdb: JobDB, queue: Queue,
           idempotency_key: Annotated[str | None, Header(min_length=1, max_length=128,
                                                         pattern=schemas.KEY_PATTERN)] = None):
    """Queue a job: a workflow's name and its parameters."""
    key = body.idempotency_key or idempotency_key
    try:
        jobdb.check_queue_quota(tenant, key)  # before the work of validating it
    except QuotaExceeded as e:
        raise quota_refusal(e) from None
    try:
        # asked now, once for the submission: the workers up now, not those of the start
        tiers = queue.tiers()
    except Exception as e:  # noqa: BLE001 (the cluster, not the request, is at fault)
        logger.warning("sizing a %s job: cannot ask the cluster for its capacity: %s", body.workflow, e)
        # the text names no address of the cluster: tenants are not told where it runs
        return JSONResponse({"detail": f"the cluster cannot be asked for its capacity to size the job "
                                       f"({type(e).__name__}); retry after {CLUSTER_RETRY_AFTER_S} s",
                             "retry_after_s": CLUSTER_RETRY_AFTER_S}, status_code=503,
                            headers={"Retry-After": str(CLUSTER_RETRY_AFTER_S)})
    try:
        footprint = queue.footprint(body.workflow, body.params, output=body.output, tiers=tiers, tenant=tenant)
    except AdmissionError as e:
        raise param_error("params", str(e)) from None
    except ParamError as e:
        name, _, _ = str(e).partition(":")
        field = ("output" if name == "output" else f"params.{name}" if name and " " not in name
                 else "params")
        raise param_error(field, str(e)) from None
    except Exception as e:  # noqa: BLE001 (a value no check foresaw is still the request's fault)
        logger.exception("validating a %s job", body.workflow)
        raise param_error("params", f"params: cannot be validated ({type(e).__name__}: "
                                    f"{str(e)[:200]})") from None
    _check_job_bytes(tenant, footprint, tiers)
    try:
        job, created = jobdb.submit(tenant, workflow=body.workflow, params=body.params, verify=body.verify,
                                    priority=body.priority, idempotency_key=key, footprint_bytes=footprint,
                                    output=body.output)
    except QuotaExceeded as e:
        raise quota_refusal(e) from None
    if created:
        queue.wake()
        return shown(queue, job)
    asked = {"workflow": body.workflow, "params": body.params, "priority": body.priority,
             "verify": body.verify, "output": body.output}
    if any(job[k] != v for k, v in asked.items()):
        raise HTTPException(409, f"idempotency_key: {key!r} already names job {job['id']}, "
                                 "submitted with other values")
    response.status_code = 200
    return shown(queue, job)


def _check_job_bytes(tenant: dict, footprint: int, tiers) -> None:
    """A 422 for a job past its tenant's per-job limit: a size, the cluster's memory (the
    default: device + host tier) or, for ``cluster``, nothing beyond what admission
    accepted (a job past the whole cluster was refused with the cluster's numbers)."""
    limit = tenant["max_job_bytes"]
    if limit == CLUSTER_JOB_BYTES:
        return
    memory = tiers.device_bytes + tiers.host_bytes
    if limit is None:
        if footprint > memory:
            raise param_error("params", f"projected footprint {format_bytes(footprint)} exceeds this tenant's "
                                        f"limit of {format_bytes(memory)} per job, the cluster's memory "
                                        f"(device + host tier: the default; with its spill disk the cluster "
                                        f"admits {format_bytes(tiers.total_bytes)} where the owner allows it)")
    elif footprint > limit:
        raise param_error("params", f"projected footprint {format_bytes(footprint)} exceeds this "
                                    f"tenant's limit of {format_bytes(limit)} per job (the cluster admits "
                                    f"{format_bytes(tiers.total_bytes)})")


@router.get("/jobs", response_model=schemas.JobList, responses=AUTH)
def list_jobs(tenant: Tenant, query: Annotated[schemas.JobQuery, Query()], jobdb: JobDB, queue: Queue):
    """This tenant's jobs (every tenant's for an admin), newest first."""
    return {"jobs": [shown(queue, j) for j in jobdb.jobs(tenant, state=query.state, limit=query.limit,
                                                         offset=query.offset)]}


@router.get("/jobs/{job_id}", response_model=schemas.Job, responses={**AUTH, **NOT_FOUND})
def get_job(job_id: JobId, tenant: Tenant, jobdb: JobDB, queue: Queue):
    """State, progress, timings, bytes spilled and error of one job; while it is queued,
    why it waits."""
    return shown(queue, _job(jobdb, job_id, tenant))


@router.post("/jobs/{job_id}/cancel", response_model=schemas.Job, responses={**AUTH, **NOT_FOUND})
def cancel(job_id: JobId, tenant: Tenant, jobdb: JobDB, queue: Queue):
    """Cancel a job: a queued one at once; a running one has its tasks stopped and its
    memory freed (its state turns cancelled when that is done). Finished jobs stay.
    While the job database is unreachable the token cannot be checked, so the cancel is
    refused (503 with Retry-After) like every other request: a revoked token cancels
    nothing."""
    job = jobdb.request_cancel(job_id, tenant)
    if job is None:
        raise HTTPException(404, f"job {job_id!r} not found")
    if job["state"] == "running" and job["cancel_requested"]:
        queue.request_cancel(job_id, tenant)  # now, not at the runner's next look
    return shown(queue, job)


@router.get("/jobs/{job_id}/result", response_model=schemas.JobResult,
            responses={**AUTH, **NOT_FOUND, 409: {"description": "The job has not finished"}})
def result(job_id: JobId, tenant: Tenant, jobdb: JobDB, queue: Queue, request: Request):
    """The result summary and run report of a finished job, and where its Zarr output is:
    a path relative to the service's results directory, and that directory itself only to
    a client on the service's own machine (which reads the store in place with nothing
    more to pass); a client elsewhere is never told the server's paths."""
    job = _job(jobdb, job_id, tenant)
    report = jobdb.report(job_id)
    if report is None:
        raise HTTPException(409, f"job {job_id} is {job['state']}; a result exists once it is done")
    output = queue.relative_output(report.get("output"))
    here = output is not None and queue.results_dir and from_this_machine(request)
    return {"id": job_id, "state": job["state"], "summary": report.get("result") or {},
            "output": output, "results_dir": queue.results_dir if here else None,
            "report": {**report, "output": output}}


@router.get("/jobs/{job_id}/logs", response_model=schemas.JobLogs, responses={**AUTH, **NOT_FOUND})
def logs(job_id: JobId, tenant: Tenant, jobdb: JobDB):
    """What happened to the job, line by line."""
    _job(jobdb, job_id, tenant)
    return {"id": job_id, "lines": jobdb.logs(job_id)}
