"""A case's row of the matrix table, from its values or from its run's report (``spillway
run --json``, a service job's result, a batch job's report), whichever path ran it."""

from __future__ import annotations

from .. import bounds
from .cases import Case
from .scale import Scale


def row(case: Case, scale: Scale, **values) -> dict:
    out = {"case": case.id, "workflow": case.workflow, "path": case.path, "footprint_bytes": None,
           "device_bytes": scale.device_bytes, "factor": scale.factor, "ok": False, "rel_error": None,
           "tolerance": None, "wall_s": None, "spilled_bytes": None, "moves": None, "refused": False, "error": None,
           # the host during the case (:mod:`.hostwatch`): filled in by the slice that runs it
           "host_peak_used_bytes": None, "host_min_available_bytes": None, "host_headroom_bytes": None,
           "under_headroom": None, "oom_kills": "unknown"}
    out.update(values)
    return out


def report_row(case: Case, scale: Scale, params: dict, report: dict, *, exited_ok: bool = True, **values) -> dict:
    """The row of a case whose run wrote a run report (``spillway run --json``, a service
    job's result, a batch job's report): its answer's check, time, spills and moves."""
    v = report.get("verify") or {}
    out = dict(params=params, footprint_bytes=report["footprint"]["total_bytes"],
               ok=bool(v.get("ok")) and exited_ok, rel_error=v.get("rel_error"), tolerance=v.get("tolerance"),
               wall_s=report["wall_s"], spilled_bytes=report["bytes_spilled"], moves=report_moves(report),
               reference=v.get("reference"))
    return row(case, scale, **{**out, **values})


def report_moves(report: dict) -> dict[str, int]:
    """Bytes per move of a ``spillway run --json`` report: its tiered stores' moves
    summed over workers, else the spill counters by tier (workers without the store)."""
    if report.get("spill"):
        return bounds.summed_moves(report["spill"])
    return {m: int(b) for m, b in (report.get("spilled_by_tier") or {}).items() if m in bounds.MOVE_CEILINGS}
