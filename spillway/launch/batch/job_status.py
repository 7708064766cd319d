"""The state of one batch job as its batch system's commands report it."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    state: str
    elapsed: str | None = None
    time_limit: str | None = None
    nodes: str | None = None
    reason: str | None = None
    exit_code: str | None = None
    #: the command that answered (``squeue``, ``sacct``), or "none" when none knows the job any more
    source: str = ""
    #: still queued or running; each system names its own states, so it decides this
    active: bool = False

    def to_json(self) -> dict:
        return asdict(self)
