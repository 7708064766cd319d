"""The workflow catalogue route: what a tenant may submit, with each workflow's parameter
schema and its defaults on this cluster."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from spillway import workflows
from . import schemas
from .limits import OffLoopJSONRoute
from .deps import Queue, Tenant
from .jobs import AUTH

router = APIRouter(tags=["catalogue"], route_class=OffLoopJSONRoute)


@router.get("/workflows", response_model=list[schemas.Workflow], responses=AUTH)
def catalogue(tenant: Tenant, queue: Queue) -> list[dict[str, Any]]:
    """The workflow catalogue with each workflow's parameter schema (defaults for this cluster)."""
    return workflows.catalogue(queue.target())
