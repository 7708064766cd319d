"""Slurm on the batch seam: its directives, ``srun`` steps and commands (``sbatch``,
``squeue``, ``sacct``, ``scancel`` on the PATH) as class attributes of
:class:`spillway.deploy.batch.BatchSystem`, which renders the script and runs them.

Before a cluster of Slurm jobs submits one, ``sbatch --version`` and ``sinfo`` must
answer (:meth:`~spillway.deploy.batch.BatchSystem.check_ready`). ``sacct`` is asked only for jobs that have left the queue, and a cluster without
accounting answers "finished" for them.
"""

from __future__ import annotations

from collections.abc import Sequence

from spillway.options.settings import Options

from ..batch import BatchError, BatchSystem, JobSettings, Layout, Run

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
