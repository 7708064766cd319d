"""The service's tables: tenants, jobs and each job's log lines.

Kept to portable SQLAlchemy types so the same models run on SQLite and PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text,
                        UniqueConstraint)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: job states; a job moves queued -> running -> done | failed | cancelled, and back to
#: queued when the service restarts while it ran
STATES = ("queued", "running", "done", "failed", "cancelled")
FINAL_STATES = ("done", "failed", "cancelled")

#: a new tenant's per-job limit: None, "the cluster's memory": a tenant added without a
#: limit may submit jobs up to the serving cluster's device memory and host tier together,
#: not its spill disk (issue 45: a default tenant started an 80 GB job on a 23 GB host).
#: The one declaration: the model's column, JobDB.add_tenant and ``spillway tenant add``
#: take it from here.
DEFAULT_MAX_JOB_BYTES: int | None = None
#: the stored per-job limit ``cluster``: whatever admission of the serving cluster accepts,
#: its spill disk included (set by the owner, never a default)
CLUSTER_JOB_BYTES = -1
#: jobs a tenant may have queued at once unless set (``tenants.max_queued`` NULL); past it
#: a submission is refused (429), so one tenant's backlog is bounded
DEFAULT_MAX_QUEUED = 100
#: jobs a tenant may run at once unless set
DEFAULT_MAX_RUNNING = 2


class Base(DeclarativeBase):
    pass


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    #: SHA-256 of the tenant's first token, as schema version 1 authenticated it; tokens now
    #: live in ``tokens`` (schema 2 copied this one there). Kept unique and filled so a
    #: database stays valid for the previous code; revoking that token changes it.
    token_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    #: added to each job's own priority when the queue orders jobs
    priority: Mapped[int] = mapped_column(Integer, default=0)
    max_running: Mapped[int] = mapped_column(Integer, default=DEFAULT_MAX_RUNNING)
    #: largest projected footprint (bytes) one of this tenant's jobs may have; NULL: the
    #: serving cluster's memory (device + host tier); -1 (:data:`CLUSTER_JOB_BYTES`): what
    #: its admission accepts, spill disk included
    max_job_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True,
                                                          default=DEFAULT_MAX_JOB_BYTES)
    #: jobs this tenant may have queued at once; NULL: :data:`DEFAULT_MAX_QUEUED` (schema 4)
    max_queued: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: the directories this tenant's jobs may read Zarr inputs in (resolved paths); NULL:
    #: the service's ``--data-dir`` (schema 5)
    data_dirs: Mapped[list | None] = mapped_column(JSON, nullable=True)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("tenant_id", "idempotency_key", name="uq_job_idempotency"),
                      # a tenant's queued jobs: its queue quota and the queue's heads (schema 4)
                      Index("ix_jobs_state_tenant", "state", "tenant_id"))

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    workflow: Mapped[str] = mapped_column(String(128))
    #: the parameters as the tenant sent them (validated again when the job starts)
    params: Mapped[dict] = mapped_column(JSON)
    verify: Mapped[bool] = mapped_column(Boolean, default=False)
    #: write the array result as a Zarr store in the service's results directory
    output: Mapped[bool] = mapped_column(Boolean, default=False)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    idempotency_key: Mapped[str | None] = mapped_column(String(128), nullable=True)
    state: Mapped[str] = mapped_column(String(16), index=True, default="queued")
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    #: projected peak bytes over the cluster, from the workflow's plan at submission
    footprint_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    tasks_total: Mapped[int] = mapped_column(Integer, default=0)
    tasks_done: Mapped[int] = mapped_column(Integer, default=0)
    bytes_spilled: Mapped[int] = mapped_column(BigInteger, default=0)
    wall_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    report: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    started: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class LogLine(Base):
    __tablename__ = "job_logs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    time: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    line: Mapped[str] = mapped_column(Text)


class Token(Base):
    """A tenant's bearer token: several may be valid at once (rotation issues the next
    before the last is revoked), each with its own expiry and last use."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    #: SHA-256 of the bearer token; the token itself is shown once and never stored
    token_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    #: recorded at most once a minute per token, so a busy client does not write per request
    last_used: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class SchemaVersion(Base):
    """One row: the schema version the database was last brought to (absent: version 1,
    the tables as first released)."""

    __tablename__ = "spillway_schema"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
