"""One job of a cluster of Slurm jobs: one node's spillway workers, in the manner of
dask-jobqueue's ``SLURMJob``, which submits it with sbatch and cancels it with scancel.

Its ``#SBATCH`` lines are the batch seam's (:class:`~.slurm.Slurm`, the ones ``spillway
slurm render`` writes), and its command is the worker command the batch script starts on
each node, attached to the scheduler's address and named as the cluster manager names the
job (so that Adaptive's retirement by name finds the job's workers): ``dask worker`` for
CPU workers, ``spillway worker`` (dask-cuda's CUDAWorker with the tiered store) for GPU
workers. Nothing of dask-jobqueue's own header or command is kept: it always writes
``--mem`` (a node of little declared memory refuses the job), and its command is dask's
worker, which knows no tiered store.

Only dask-jobqueue's public API is used (the seam module, :mod:`spillway.upstream`, checks it as
``jobqueue_script``): the set-up lines go in as ``job_script_prologue=``, and the script is
this job's own :meth:`SlurmWorkerJob.job_script` (dask-jobqueue's ``Job.job_file`` writes
what it returns), in the layout of dask-jobqueue's: shebang, header, set-up, command. The
``slurm`` extra pins dask-jobqueue below 0.10, and ``tests/deploy/test_slurm_cluster.py``
checks the script as text.

A job sbatch refuses does not fail the cluster manager's background task (a traceback
printed where nobody asked, and a job object left half started that distributed's
``close()`` then trips on): it is marked failed, with the refusal in one line as
:attr:`SlurmWorkerJob.refusal`, which the cluster says at once. Awaiting a job starts it
through the seam module's ``start_once`` (seam ``process_interface_start``: distributed's
own ``__await__`` asserts that a start leaves the job running).
"""

from __future__ import annotations

import re
import shlex

from dask_jobqueue.slurm import SLURMJob
from distributed.core import Status

from spillway import upstream
from spillway.options.settings import Options

from .. import commands
from ..batch import JobSettings
from .slurm import Slurm


def worker_command(options: Options, job: JobSettings, *, address: str, name: str) -> tuple[list[str], dict[str, str]]:
    """The command one node's workers run and the environment they need."""
    layout = Slurm().layout(options, job)
    env = dict(commands.worker_environment(options))
    if layout.kind == "cpu":
        args = commands.cpu_worker_args(options, scheduler_address=address, name=name, protocol=layout.protocol,
                                        n_workers=layout.workers_per_node)
        return [job.python, "-m", "distributed.cli.dask_worker", *args], env
    if layout.protocol == "ucx":
        env.update(commands.ucx_environment(options))
    args = commands.spillway_worker_args(options, scheduler_address=address, name=name, protocol=layout.protocol)
    return [job.python, "-m", "spillway", *args], env


def lifetime_environment(job: JobSettings) -> dict[str, str]:
    """Workers retire before the wall time (the batch script's lifetime), staggered so
    that the jobs of one cluster do not all go at once."""
    stagger = max(1, (job.walltime_s - job.lifetime_s) // 2)
    return {"DASK_DISTRIBUTED__WORKER__LIFETIME__DURATION": f"{job.lifetime_s}s",
            "DASK_DISTRIBUTED__WORKER__LIFETIME__STAGGER": f"{stagger}s"}


def refusal_line(submit: str, error: BaseException) -> str:
    """One line of why ``submit`` did not take a job, from what dask-jobqueue raised: its
    RuntimeError carries the exit code and the command's whole stdout and stderr."""
    text = str(error)
    code = re.search(r"Exit code: (-?\d+)", text)
    if code is None:
        lines = [line for line in text.splitlines() if line.strip()]
        return f"{submit} did not take the job: {type(error).__name__}: {lines[0] if lines else 'no message'}"
    stderr = text.partition("\nstderr:\n")[2]
    stdout = text.partition("\nstdout:\n")[2].partition("\nstderr:\n")[0]
    said = [line.strip() for line in (stderr.strip() or stdout.strip()).splitlines() if line.strip()]
    return f"{submit} refused the job (exit {code.group(1)}): {said[-1] if said else 'no output'}"


class SlurmWorkerJob(SLURMJob):
    """One Slurm job, one node's workers of ``spillway_options`` on the node of
    ``spillway_job`` (a job of one node)."""

    def __init__(self, scheduler=None, name=None, *, spillway_options: Options, spillway_job: JobSettings,
                 **kwargs):
        system = Slurm()
        layout = system.layout(spillway_options, spillway_job)
        command, env = worker_command(spillway_options, spillway_job, address=str(scheduler), name=str(name))
        env.update(lifetime_environment(spillway_job))
        #: the set-up lines before the command (also handed to dask-jobqueue, whose own
        #: script would carry them)
        self.setup_lines = [*spillway_job.setup, *(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()))]
        super().__init__(scheduler=scheduler, name=name, python=spillway_job.python,
                         job_name=spillway_job.job_name, **{**kwargs, "job_script_prologue": list(self.setup_lines)})
        self.job_header = "\n".join(system.directives(spillway_job, layout))
        # exec: scancel's SIGTERM reaches the nannies themselves, which close their workers
        self.command_line = "exec " + shlex.join(command)
        #: why the job was not submitted, in one line (None: submitted, or not yet tried)
        self.refusal: str | None = None

    def job_script(self) -> str:
        """The job's script: shebang, the ``#SBATCH`` header, the set-up, the command."""
        parts = [self.shebang, "", self.job_header, "\n".join(filter(None, self.setup_lines)), self.command_line]
        return "\n".join(parts) + "\n"

    def __await__(self):
        # a refused job is failed, not running, and the cluster says why: distributed's own
        # __await__ asserts that every start leaves it running
        return upstream.start_once(self)

    async def start(self):
        try:
            await super().start()
        except Exception as e:
            self.refusal = refusal_line(self.submit_command.split()[0], e)
            self.status = Status.failed

    async def close(self):
        await super().close()  # scancel, where the job was submitted
        self.status = Status.closed
