"""What leaves the job database: tenants and jobs as plain dicts (JSON-able, times as ISO
strings in UTC), and the clock and token digest that rows are written with."""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone

from .models import DEFAULT_MAX_QUEUED, Job, Tenant


def now() -> datetime:
    return datetime.now(timezone.utc)


def hash_token(token: str) -> str:
    # Tokens are 256 random bits, so a plain digest is enough: there is nothing to guess.
    return hashlib.sha256(token.encode()).hexdigest()


def _iso(t: datetime | None) -> str | None:
    if t is None:
        return None
    if t.tzinfo is None:  # SQLite hands back naive datetimes; they were stored as UTC
        t = t.replace(tzinfo=timezone.utc)
    return t.isoformat()


def tenant_dict(t: Tenant) -> dict:
    return {
        "id": t.id, "name": t.name, "admin": t.admin, "priority": t.priority,
        "max_running": t.max_running, "max_job_bytes": t.max_job_bytes,
        "max_queued": t.max_queued if t.max_queued is not None else DEFAULT_MAX_QUEUED,
        "data_dirs": list(t.data_dirs) if t.data_dirs is not None else None,
        "revoked": t.revoked, "created": _iso(t.created),
    }


def job_dict(j: Job, tenant_name: str | None = None) -> dict:
    total = j.tasks_total or 0
    done = j.tasks_done or 0
    if j.state == "done":
        fraction = 1.0
    else:
        fraction = min(1.0, done / total) if total else 0.0
    return {
        "id": j.id, "tenant": tenant_name, "workflow": j.workflow, "params": j.params,
        "verify": j.verify, "output": j.output, "priority": j.priority, "idempotency_key": j.idempotency_key,
        "state": j.state, "cancel_requested": j.cancel_requested,
        "progress": {"tasks_done": done, "tasks_total": total, "fraction": fraction},
        "footprint_bytes": j.footprint_bytes, "attempts": j.attempts,
        "bytes_spilled": j.bytes_spilled, "error": j.error,
        "timings": {"created": _iso(j.created), "started": _iso(j.started),
                    "finished": _iso(j.finished), "wall_s": j.wall_s},
    }
