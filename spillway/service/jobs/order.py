"""Which queued job starts next: a pure function of the queue, what runs and the room left.

Order: higher priority first (the tenant's priority plus the job's own); among equals the
tenant with fewer jobs running, then the tenant whose last job started longest ago (round
robin), so one tenant's backlog cannot hold the cluster, nor delay another tenant's next
job; then the oldest. A tenant at its running-jobs quota waits. The loop hands in each
tenant's next job only (:meth:`spillway.service.jobdb.JobDB.queued`), so a backlog of
thousands costs a pass one row. The chosen job
starts only when its projected footprint fits the memory the running jobs leave free;
a job larger than the whole cluster still starts when nothing else runs (spilling lets
it finish), so it cannot wait for ever. Jobs behind a job that does not fit wait too,
so a large job is not starved by a stream of small ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from spillway.options.sizes import format_bytes


def _eligible(queued: list[dict], per_tenant: Counter, last_started: Mapping | None = None) -> list[dict]:
    """Queued jobs that may start as far as their tenant goes, in the order they start.
    ``last_started``: tenant id -> when its last job started (any increasing number)."""
    last_started = last_started or {}
    waiting = [j for j in queued
               if not j["tenant_revoked"] and not j["cancel_requested"]
               and per_tenant[j["tenant_id"]] < j["tenant_max_running"]]
    waiting.sort(key=lambda j: (-(j["tenant_priority"] + j["priority"]), per_tenant[j["tenant_id"]],
                                last_started.get(j["tenant_id"], float("-inf")), j["timings"]["created"], j["id"]))
    return waiting


def _fits(job: dict, running: list[dict], capacity_bytes: int) -> bool:
    return not running or sum(j["footprint_bytes"] for j in running) + job["footprint_bytes"] <= capacity_bytes


def next_job(queued: list[dict], running: list[dict], capacity_bytes: int,
             last_started: Mapping | None = None) -> dict | None:
    """The job to start now, or None. ``queued`` rows carry ``tenant_id``,
    ``tenant_priority``, ``tenant_max_running`` and ``tenant_revoked`` (see
    :meth:`spillway.service.jobdb.JobDB.queued`); ``running`` rows carry ``tenant_id``;
    ``last_started`` maps a tenant id to when its last job started."""
    waiting = _eligible(queued, Counter(j["tenant_id"] for j in running), last_started)
    if waiting and _fits(waiting[0], running, capacity_bytes):
        return waiting[0]
    return None


def waiting_reasons(queued: list[dict], running: list[dict], capacity_bytes: int,
                    last_started: Mapping | None = None) -> dict[str, str]:
    """Why each queued job has not started, by job id, in words a tenant reads in its
    job's status: the same rules as :func:`next_job`, said."""
    per_tenant = Counter(j["tenant_id"] for j in running)
    reasons = {}
    for j in queued:
        if j["tenant_revoked"] or j["cancel_requested"]:
            continue
        n = per_tenant[j["tenant_id"]]
        if n >= j["tenant_max_running"]:
            reasons[j["id"]] = (f"waiting for its tenant's running jobs: {n} of at most "
                                f"{j['tenant_max_running']} running")
    waiting = _eligible(queued, per_tenant, last_started)
    if not waiting:
        return reasons
    head = waiting[0]
    if _fits(head, running, capacity_bytes):
        memory = "starting"  # the loop starts it on its next pass
        reasons[head["id"]] = memory
    else:
        memory = memory_reason(head, running, capacity_bytes)
        reasons[head["id"]] = memory
    for j in waiting[1:]:
        reasons[j["id"]] = f"waiting behind job {head['id'][:12]} (it starts first: {memory})"
    return reasons


def memory_reason(job: dict, running: list[dict], capacity_bytes: int) -> str:
    """``waiting for memory: 1 running job holds 203.38 GiB ...`` for a job that does not
    fit beside the running ones."""
    held = sum(j["footprint_bytes"] for j in running)
    n = len(running)
    need = job["footprint_bytes"]
    text = (f"waiting for memory: {n} running job{'s' if n != 1 else ''} hold{'s' if n == 1 else ''} "
            f"{format_bytes(held)} of the workers' {format_bytes(capacity_bytes)}; this job needs "
            f"{format_bytes(need)}")
    if need > capacity_bytes:
        return text + ", more than the workers' memory, so it runs alone (spilling) once they end"
    return text + f" and starts when {format_bytes(need - max(0, capacity_bytes - held))} more is free"


def behind_reason(head_id: str) -> str:
    """Why a queued job that is not its tenant's next waits."""
    return (f"waiting behind its tenant's job {head_id[:12]} (a tenant's jobs start one at a time, higher "
            "priority first, then the oldest)")
