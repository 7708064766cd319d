"""Submit, query and cancel batch jobs through Slurm's own commands.

The commands are ``sbatch``, ``squeue``, ``sacct`` and ``scancel`` on the PATH; their
output is parsed by the pure functions here. ``sacct`` is asked only for jobs that have
left the queue, and a cluster without accounting answers "finished" for them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass

from spillway.cluster.errors import SpillwayError

_JOB_ID = re.compile(r"^\d+(?:_\d+)?$")
#: squeue columns: id, state, elapsed, limit, nodes, reason or node list
SQUEUE_FORMAT = "%i|%T|%M|%l|%D|%R"
SACCT_FIELDS = "JobID,State,Elapsed,ExitCode"
COMMAND_TIMEOUT_S = 60


class SlurmError(SpillwayError):
    """A Slurm command failed; the message carries its own one-line error."""

    exit_code = 1


class JobIdError(SpillwayError, ValueError):
    exit_code = 2


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    state: str
    elapsed: str | None = None
    time_limit: str | None = None
    nodes: str | None = None
    reason: str | None = None
    exit_code: str | None = None
    #: "squeue", "sacct", or "none" when neither knows the job any more
    source: str = "squeue"

    @property
    def active(self) -> bool:
        return self.state in {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
                              "RESIZING", "SIGNALING", "STAGE_OUT"}

    def to_json(self) -> dict:
        return {**asdict(self), "active": self.active}


def check_job_id(job_id: str) -> str:
    text = str(job_id).strip()
    if not _JOB_ID.match(text):
        raise JobIdError(f"job id: {job_id!r} is not a Slurm job id (digits, or digits_digits for an array task)")
    return text


def parse_sbatch(output: str) -> str:
    """The job id from ``sbatch --parsable`` (``123`` or ``123;cluster``)."""
    first = output.strip().splitlines()[-1] if output.strip() else ""
    job_id = first.split(";", 1)[0].strip()
    if not _JOB_ID.match(job_id):
        raise SlurmError(f"sbatch printed no job id: {output.strip()!r}")
    return job_id


def parse_squeue(output: str, job_id: str) -> JobStatus | None:
    for line in output.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 6 and parts[0] == job_id:
            return JobStatus(job_id=job_id, state=parts[1], elapsed=parts[2], time_limit=parts[3],
                             nodes=parts[4], reason=parts[5], source="squeue")
    return None


def parse_sacct(output: str, job_id: str) -> JobStatus | None:
    """The job's own line (not its steps) from ``sacct -n -P``."""
    for line in output.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0] == job_id:
            # sacct writes "CANCELLED by 0"; the first word is the state
            return JobStatus(job_id=job_id, state=parts[1].split()[0] if parts[1] else "UNKNOWN",
                             elapsed=parts[2], exit_code=parts[3], source="sacct")
    return None


def _command(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SlurmError(f"{name}: not found on the PATH; run this on a Slurm login node")
    return path


def _run(args: list[str], *, input: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, input=input, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{args[0]}: no answer within {COMMAND_TIMEOUT_S}s") from None


def _error(name: str, done: subprocess.CompletedProcess) -> SlurmError:
    message = (done.stderr or done.stdout).strip().splitlines()
    return SlurmError(f"{name} failed (exit {done.returncode}): {message[-1] if message else 'no output'}")


def submit(script: str) -> str:
    """Submit the script text; returns the job id."""
    done = _run([_command("sbatch"), "--parsable"], input=script)
    if done.returncode != 0:
        raise _error("sbatch", done)
    return parse_sbatch(done.stdout)


def status(job_id: str) -> JobStatus:
    job_id = check_job_id(job_id)
    done = _run([_command("squeue"), "-h", "-j", job_id, "--states=all", "-o", SQUEUE_FORMAT])
    found = parse_squeue(done.stdout, job_id) if done.returncode == 0 else None
    if found is not None:
        return found
    sacct = shutil.which("sacct")
    if sacct is not None:
        done = _run([sacct, "-n", "-P", "-j", job_id, "-o", SACCT_FIELDS])
        found = parse_sacct(done.stdout, job_id) if done.returncode == 0 else None
        if found is not None:
            return found
    # squeue forgets finished jobs after MinJobAge; without accounting nothing else knows
    return JobStatus(job_id=job_id, state="UNKNOWN", source="none",
                     reason="not in the queue (finished a while ago, or never submitted) and no accounting record")


def cancel(job_id: str) -> None:
    job_id = check_job_id(job_id)
    done = _run([_command("scancel"), job_id])
    if done.returncode != 0:
        raise _error("scancel", done)
