"""Request and response bodies of the HTTP API; FastAPI turns them into the OpenAPI spec."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

#: idempotency keys: printable text (no NUL or control characters, which databases refuse)
KEY_PATTERN = r"^[^\x00-\x1f\x7f]+$"

#: job ids: what the job database makes them (uuid4().hex); anything else is refused
#: (422) before it reaches the database
JOB_ID_PATTERN = r"^[0-9a-f]{32}$"

State = Literal["queued", "running", "done", "failed", "cancelled"]


def job_request_model(workflow_names: list[str], param_names: dict[str, list[str]] | None = None) -> type[BaseModel]:
    """The body of ``POST /jobs``; ``workflow`` is an enum of the registered names so the
    spec (and clients generated from it) know the catalogue. Strict: a boolean is ``true``
    or ``false`` (not ``"yes"``, ``"true"`` or ``0``), a priority a JSON integer.

    ``params`` is published as the API enforces it (``param_names``: each workflow's
    parameter names): for each workflow, an object of at most its parameters, keyed by
    their names; each value's schema is the workflow's (GET /workflows)."""
    names = tuple(workflow_names) or ("",)
    param_names = param_names or {}
    everything = sorted(set().union(*param_names.values())) if param_names else []
    per_workflow = [{"if": {"properties": {"workflow": {"const": name}}, "required": ["workflow"]},
                     "then": {"properties": {"params": {"propertyNames": {"enum": list(keys)},
                                                        "maxProperties": len(keys)}}}}
                    for name, keys in param_names.items()]
    params_schema = {"propertyNames": {"enum": everything}} if everything else {}
    return create_model(
        "JobRequest",
        __config__=ConfigDict(extra="forbid", strict=True,
                              json_schema_extra={"allOf": per_workflow} if per_workflow else None),
        workflow=(Literal[names], Field(description="A registered workflow's name (GET /workflows).")),
        params=(dict[str, Any], Field(default_factory=dict, json_schema_extra=params_schema,
                                      description="Parameters, validated against the workflow's schema "
                                                  "(GET /workflows): its parameters' names only.")),
        priority=(int, Field(0, ge=-10, le=10, description="Added to the tenant's priority; higher runs first.")),
        verify=(bool, Field(False, description="Check the result against a NumPy float64 reference.")),
        output=(bool, Field(False, description="Write the array result as a Zarr v3 store on the service's "
                                               "results directory (GET /jobs/{id}/result says where).")),
        idempotency_key=(str | None, Field(None, min_length=1, max_length=128, pattern=KEY_PATTERN,
                                           description="A retry with the same key returns the same job.")),
    )


class JobQuery(BaseModel):
    """Filters of ``GET /jobs``; unknown ones are refused rather than ignored."""

    model_config = ConfigDict(extra="forbid")

    state: State | None = Field(None, description="Only jobs in this state.")
    limit: int = Field(100, ge=1, le=1000, description="At most this many jobs.")
    offset: int = Field(0, ge=0, le=10**9, description="Skip this many (newest first).")


class Progress(BaseModel):
    tasks_done: int
    tasks_total: int
    fraction: float


class Timings(BaseModel):
    created: str | None
    started: str | None
    finished: str | None
    wall_s: float | None


class Job(BaseModel):
    id: str
    tenant: str | None
    workflow: str
    params: dict[str, Any]
    verify: bool
    output: bool
    priority: int
    idempotency_key: str | None
    state: State
    cancel_requested: bool
    progress: Progress
    footprint_bytes: int
    attempts: int
    bytes_spilled: int
    error: str | None
    timings: Timings
    waiting: str | None = Field(None, description="Why a queued job has not started yet (memory held by "
                                                   "running jobs, the tenant's running-jobs quota, or a job "
                                                   "ahead of it); null once it runs.")


class JobList(BaseModel):
    jobs: list[Job]


class JobResult(BaseModel):
    id: str
    state: State
    summary: dict[str, Any] = Field(description="The workflow's result summary.")
    output: str | None = Field(description="The Zarr output's path relative to the service's results "
                                           "directory (`<job id>.zarr`), for jobs that write one.")
    results_dir: str | None = Field(None, description="The service's results directory, given only to a request "
                                                     "from the service's own machine (a loopback address), where "
                                                     "the client reads the output in place; null elsewhere.")
    report: dict[str, Any] = Field(description="The full run report (timings, transfers, spills, peaks).")


class LogLine(BaseModel):
    time: str | None
    line: str


class JobLogs(BaseModel):
    id: str
    lines: list[LogLine]


class Workflow(BaseModel):
    name: str
    description: str
    schema_: dict[str, Any] = Field(alias="schema")

    model_config = ConfigDict(populate_by_name=True)


class DatabaseHealth(BaseModel):
    ok: bool
    backend: str
    error: str | None = Field(description="What kind of failure while it is down (never the driver's text, "
                                          "which names the database's address: the service's log has that).")
    down_since: str | None
    checked: str | None = Field(description="When the service last probed it.")


class ClusterHealth(BaseModel):
    ok: bool
    status: str


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    down: list[Literal["database", "cluster"]] = Field(description="What is down (503 when any).")
    kind: str
    workers: int
    queued: int | None = Field(description="As of the last probe; null while the database is down.")
    running: int | None
    database: DatabaseHealth
    cluster: ClusterHealth


class PublicHealth(BaseModel):
    """``/healthz`` to a caller without a valid token: whether the service is up, nothing more."""

    status: Literal["ok", "degraded"]


class Unavailable(BaseModel):
    detail: str
    retry_after_s: int
