"""The Slurm batch launcher (``spillway slurm``): a batch analysis as one sbatch job, a
scheduler on the first node, one worker per GPU on every node, the workflows run from the
batch step and their reports written next to the job's output.

:class:`Slurm` is Slurm on the batch seam (:mod:`spillway.launch.batch`): its directives,
``srun`` steps and commands (``sbatch``, ``squeue``, ``sacct``, ``scancel`` on the PATH)
as class attributes of :class:`~spillway.launch.batch.BatchSystem`, which renders the
script and runs them. :func:`job_script` renders the script, a pure function of its
arguments; :class:`SlurmBatch`, the backend, submits it (:func:`submit`), and a
``Slurm()`` queries and cancels jobs. Before a cluster of Slurm jobs
(:mod:`.slurm_jobs`) submits one, ``sbatch --version`` and ``sinfo`` must answer
(:meth:`~spillway.launch.batch.BatchSystem.check_ready`). ``sacct`` is asked only for
jobs that have left the queue, and a cluster without accounting answers "finished" for
them.

On a machine without Slurm, :func:`run_script` runs a rendered one-node script: its
steps call ``srun``, and the stand-in next to this file (``srun``, a short bash script)
runs each step's command on this machine as a one-node allocation would, and refuses a
step for more nodes or tasks. :func:`run_script` puts it first on ``PATH``, sets what
``sbatch`` would (``SLURM_JOB_ID``, ``SLURM_SUBMIT_DIR``), writes the job's output file
where its ``--output`` directive says, and stops every process the script left behind
when it ends or runs out of time. Used by the matrix's ``batch`` path; Slurm itself stays
tested where it runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from spillway.options.errors import OptionsError
from spillway.options.settings import Options

from .batch import (BatchError, BatchSystem, JobSettings, Layout, Run, format_walltime, parse_walltime,
                    worker_lifetime)
from .plan import LaunchPlan
from .spec import WorkerSpec

__all__ = ["BatchRun", "JobSettings", "Layout", "Run", "Slurm", "SlurmBatch", "SlurmError", "format_walltime",
           "install_srun", "job_script", "layout", "parse_walltime", "run_script", "submit", "worker_lifetime"]

#: squeue columns: id, state, elapsed, limit, nodes, reason or node list
SQUEUE_FORMAT = "%i|%T|%M|%l|%D|%R"
SACCT_FIELDS = "JobID,State,Elapsed,ExitCode"


class SlurmError(BatchError):
    """A Slurm command failed; the message carries its own one-line error."""


class Slurm(BatchSystem):
    """Slurm: ``#SBATCH`` directives, ``srun --overlap`` steps in one allocation, and its
    own commands for the queue."""

    name = "Slurm"
    directive_prefix = "#SBATCH"
    directive_formats = (
        "--job-name={job_name}", "--nodes={nodes}", "--ntasks-per-node=1", "--gpus-per-node={gpus_per_node}",
        "--cpus-per-task={cpus_per_task}", "--mem={mem}", "--time={walltime}", "--partition={partition}",
        "--account={account}", "--qos={qos}", "--output={output_dir}/spillway-%j.out",
    )
    job_id_variable = "SLURM_JOB_ID"
    script_name = "job.sbatch"
    step_launcher = "srun"
    scheduler_step_note = "# --overlap lets the scheduler, the workers and this step share the allocation"
    scheduler_step = "srun --overlap --nodes=1 --ntasks=1 --cpu-bind=none"
    worker_step_note = (
        "# One task per node; --cpu-bind=none leaves CPU affinity to the workers, and a worker\n"
        "# that cannot pin its CPUs (a partial-node allocation) logs a warning and carries on."
    )
    # the CPUs named again on the step: srun does not take the job's CPUs per task from it in every version
    worker_step = "srun --overlap --nodes={nodes} --ntasks-per-node=1 --cpus-per-task={cpus_per_task} --cpu-bind=none"

    submit_command = ("sbatch", "--parsable")
    # --parsable prints the id, then ";cluster" on a federation
    submitted_regexp = r"(?P<job_id>\d+(?:_\d+)?)\s*(?:;.*)?"
    status_command = ("squeue", "-h", "-j", "{job_id}", "--states=all", "-o", SQUEUE_FORMAT)
    status_fields = ("job_id", "state", "elapsed", "time_limit", "nodes", "reason")
    # -n -P: no header, "|" between fields; a job's steps have lines of their own (17.batch)
    history_command = ("sacct", "-n", "-P", "-j", "{job_id}", "-o", SACCT_FIELDS)
    history_fields = ("job_id", "state", "elapsed", "exit_code")
    active_states = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
                               "RESIZING", "SIGNALING", "STAGE_OUT"})
    cancel_command = ("scancel", "{job_id}")
    # sbatch --version answers without a controller; sinfo asks the controller for its
    # partitions, and fails at once where there is no configuration or no slurmctld
    probe_commands = (("sbatch", "--version"), ("sinfo", "-h", "-o", "%P"))
    job_id_regexp = r"\d+(?:_\d+)?"
    job_id_form = "digits, or digits_digits for an array task"
    error = SlurmError


def job_script(options: Options, job: JobSettings, runs: Sequence[Run]) -> str:
    """The sbatch script that runs ``runs`` on a cluster started inside the job, in the
    manner of dask-jobqueue's ``job_script()``: a pure function of its arguments."""
    return Slurm().job_script(options, job, runs)


def layout(options: Options, job: JobSettings) -> Layout:
    """Workers and transport of a Slurm job; what cannot work stops here."""
    return Slurm().layout(options, job)


class SlurmBatch:
    """Backend of ``spillway slurm submit``: ``runs`` in one batch job of ``job``, its
    cluster started inside the job (the nodes resolve their workers' specs: ``specs`` is
    empty). :meth:`start` renders the script, makes the job's output directory and submits
    it; it returns the job id."""

    def __init__(self, job: JobSettings, runs: Sequence[Run], *, system: Slurm | None = None):
        self.job, self.runs, self.system = job, tuple(runs), system or Slurm()

    def start(self, options: Options, launch: LaunchPlan, specs: tuple[WorkerSpec, ...] = ()) -> str:
        system = self.system
        text = system.job_script(options, self.job, self.runs)
        # nothing is made for a job that cannot be submitted from here
        system.require(system.submit_command)
        output_dir = self.job.output_dir
        try:
            os.makedirs(output_dir, exist_ok=True)
        except OSError as e:
            raise OptionsError(f"output-dir: cannot make {output_dir!r} ([Errno {e.errno}] {e.strerror})") from None
        return system.submit(text)


def submit(options: Options, job: JobSettings, runs: Sequence[Run], *, system: Slurm | None = None) -> str:
    """Submit ``runs`` as one batch job (:class:`SlurmBatch`); returns its job id. The
    plan handed to the backend is the job's, as known off the nodes (:func:`layout`)."""
    system = system or Slurm()
    job_layout = system.layout(options, job)
    plan = LaunchPlan(kind=job_layout.kind, n_workers=job_layout.n_workers, protocol=job_layout.protocol)
    return SlurmBatch(job, runs, system=system).start(options, plan, ())


# --- a one-node script run without Slurm

SRUN = Path(__file__).with_name("srun")


def install_srun(bin_dir: str | os.PathLike) -> Path:
    """The stand-in copied into ``bin_dir`` as an executable ``srun`` (installed packages
    do not always keep the file's executable bit)."""
    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    target = bin_dir / "srun"
    shutil.copyfile(SRUN, target)
    target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return target


@dataclass
class BatchRun:
    returncode: int | None
    #: the job's output file (``--output``), what sbatch would have written
    output: str
    #: the job's results folder (``OUTPUT_DIR/spillway-JOBID``): reports and logs
    results: Path
    timed_out: bool = False

    def report(self, index: int, workflow: str) -> dict | None:
        """The JSON report of the ``index``-th (1-based) workflow, None when it wrote none."""
        for path in sorted(self.results.glob(f"{index:02d}-{workflow}.json")):
            text = path.read_text().strip()
            if text:
                return json.loads(text.splitlines()[-1])
        return None

    def log(self, index: int, workflow: str) -> str:
        path = self.results / f"{index:02d}-{workflow}.log"
        return path.read_text() if path.exists() else ""


def run_script(text: str, output_dir: str | os.PathLike, *, job_id: str = "4242", timeout: float = 540,
               env: dict | None = None) -> BatchRun:
    """Run the batch script ``text`` (rendered with ``output_dir``) here with the stand-in
    ``srun``; ``timeout`` seconds at most, then the whole process group is killed."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    work = output_dir / f".one-node-{job_id}"
    install_srun(work / "bin")
    script = work / "job.sbatch"
    script.write_text(text)
    base = dict(os.environ if env is None else env)
    environment = {**base, "PATH": f"{work / 'bin'}:{base.get('PATH', '')}", "SLURM_JOB_ID": job_id,
                   "SLURM_JOB_NUM_NODES": "1", "SLURM_SUBMIT_DIR": str(output_dir)}
    out_path = output_dir / f"spillway-{job_id}.out"
    timed_out = False
    with open(out_path, "w") as out:
        # a session of its own: on a timeout the scheduler and workers go with the script
        proc = subprocess.Popen(["bash", str(script)], env=environment, cwd=output_dir, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop_group(proc)
    _stop_group(proc)  # anything the script's own cleanup left
    return BatchRun(proc.returncode, out_path.read_text(), output_dir / f"spillway-{job_id}", timed_out)


def _stop_group(proc: subprocess.Popen, grace_s: float = 20) -> None:
    """SIGTERM the script's process group, SIGKILL what is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                try:
                    os.killpg(proc.pid, 0)
                except (ProcessLookupError, PermissionError):
                    return
            time.sleep(0.2)
