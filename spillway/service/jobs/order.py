"""Which queued job starts next: a pure function of the queue, what runs and the room left.

Order: higher priority first (the tenant's priority plus the job's own); among equals the
tenant with fewer jobs running, so one tenant's burst cannot hold the cluster while
another waits; then the oldest. A tenant at its running-jobs quota waits. The chosen job
starts only when its projected footprint fits the memory the running jobs leave free;
a job larger than the whole cluster still starts when nothing else runs (spilling lets
it finish), so it cannot wait for ever. Jobs behind a job that does not fit wait too,
so a large job is not starved by a stream of small ones.
"""

from __future__ import annotations

from collections import Counter


def next_job(queued: list[dict], running: list[dict], capacity_bytes: int) -> dict | None:
    """The job to start now, or None. ``queued`` rows carry ``tenant_id``,
    ``tenant_priority``, ``tenant_max_running`` and ``tenant_revoked`` (see
    :meth:`spillway.service.jobdb.JobDB.queued`); ``running`` rows carry ``tenant_id``."""
    per_tenant = Counter(j["tenant_id"] for j in running)
    used = sum(j["footprint_bytes"] for j in running)
    waiting = [j for j in queued
               if not j["tenant_revoked"] and not j["cancel_requested"]
               and per_tenant[j["tenant_id"]] < j["tenant_max_running"]]
    if not waiting:
        return None
    waiting.sort(key=lambda j: (-(j["tenant_priority"] + j["priority"]),
                                per_tenant[j["tenant_id"]], j["timings"]["created"], j["id"]))
    head = waiting[0]
    if not running or used + head["footprint_bytes"] <= capacity_bytes:
        return head
    return None
