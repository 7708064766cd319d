"""``/healthz``: liveness for load balancers and people, answered from the service's last
look at the job database and the cluster's client, never by waiting on either."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from . import schemas
from .limits import OffLoopJSONRoute

router = APIRouter(tags=["service"], route_class=OffLoopJSONRoute)


@router.get("/healthz", response_model=schemas.Health,
            responses={503: {"model": schemas.Health, "description": "Something is down: `down` names it"}})
async def healthz(request: Request):
    """Liveness: whether the job database answers and the cluster's client is up; 503
    naming what is down. Answered from the service's last look (the database is
    probed every 2 s, every 0.5 s while down), never by waiting on the database."""
    jobdb, queue = request.app.state.jobdb, request.app.state.queue
    health = jobdb.health
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
            # the backend's name but not its address: the error is its kind alone
            "database": {**health.as_dict(), "backend": jobdb.engine.dialect.name},
            "cluster": {"ok": "cluster" not in down, "status": str(client_status)}}
    if down:
        return JSONResponse(body, status_code=503, headers={"Retry-After": str(health.retry_after_s())})
    return body
