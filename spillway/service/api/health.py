"""``/healthz``: liveness for load balancers and people, answered from the service's last
look at the job database and the cluster's client, never by waiting on either."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ..jobdb.rows import hash_token
from . import schemas
from .auth import bearer_token
from .limits import OffLoopJSONRoute

router = APIRouter(tags=["service"], route_class=OffLoopJSONRoute)


@router.get("/healthz", response_model=None,
            responses={200: {"model": schemas.Health | schemas.PublicHealth,
                             "description": "ok; the whole reading for a caller with a valid token"},
                       503: {"model": schemas.Health | schemas.PublicHealth,
                             "description": "Something is down: `down` names it, to a caller with a valid token"}})
async def healthz(request: Request):
    """Liveness: whether the job database answers and the cluster's client is up; 503
    while something is down. Answered from the service's last look (the database is
    probed every 2 s, every 0.5 s while down), never by waiting on the database.

    A caller without a valid token (a load balancer) is told ``status`` alone; with one,
    what is down, the cluster's kind and workers, the queue and the database's backend.
    The token is checked against the live tokens the service last read, never the
    database, so the answer never waits."""
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
    if not _trusted(request):
        body = {"status": body["status"]}
    if down:
        return JSONResponse(body, status_code=503, headers={"Retry-After": str(health.retry_after_s())})
    return JSONResponse(body)


def _trusted(request: Request) -> bool:
    """Whether the request bears a live token, as of the service's last read of them."""
    token = bearer_token(request)
    known = getattr(request.app.state, "known_tokens", None)
    return bool(token) and known is not None and known.known_now(hash_token(token))
