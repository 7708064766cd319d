"""The launcher of a notebook's cluster of Slurm jobs (``spillway.slurm()``), in the
manner of dask-jobqueue's ``slurm.py``: its ``SLURMCluster`` (the scheduler in this
process, sbatch and scancel, ``scale(jobs=)``, ``adapt(minimum_jobs=, maximum_jobs=)``,
``job_script()``, ``close()``) with spillway's jobs, from the same options object and job
settings as ``spillway slurm render``. :class:`SlurmJobs` is its backend and
:func:`open_jobs` the session a notebook's cluster (:mod:`spillway.clusters.slurm`) holds.

A job is one node (:class:`SlurmWorkerJob`): ``scale(jobs=N)`` asks for N nodes, each
job's workers named after it (``NAME-0``, ``NAME-1``, ... with several) so that scaling
down retires a job's workers by name before it is cancelled. The scheduler listens where
the options say (loopback by default, which only a Slurm whose nodes are this machine
reaches: set ``host`` or ``interface`` to the login node's address on the compute nodes'
network).

A job's ``#SBATCH`` lines are the batch launcher's (:class:`~.slurm_batch.Slurm`, the
ones ``spillway slurm render`` writes), and its command is the worker command the batch
script starts on each node, attached to the scheduler's address and named as the cluster
manager names the job (so that Adaptive's retirement by name finds the job's workers):
``dask worker`` for CPU workers, ``spillway worker`` (dask-cuda's CUDAWorker with the
tiered store) for GPU workers. Nothing of dask-jobqueue's own header or command is kept:
it always writes ``--mem`` (a node of little declared memory refuses the job), and its
command is dask's worker, which knows no tiered store.

Only dask-jobqueue's public API is used (the seam module, :mod:`spillway.upstream`, checks
it as ``jobqueue_script``): the set-up lines go in as ``job_script_prologue=``, and the
script is the job's own :meth:`SlurmWorkerJob.job_script` (dask-jobqueue's ``Job.job_file``
writes what it returns), in the layout of dask-jobqueue's: shebang, header, set-up,
command. The ``slurm`` extra pins dask-jobqueue below 0.10, and
``tests/launch/test_slurm_cluster.py`` checks the script as text.

Before its first job, :meth:`SlurmJobCluster.check_ready` asks Slurm's commands whether
they answer here. A job sbatch refuses does not fail the cluster manager's background task
(a traceback printed where nobody asked, and a job object left half started that
distributed's ``close()`` then trips on): it is marked failed, with the refusal in one
line as :attr:`SlurmWorkerJob.refusal`, dropped from the spec and said by
:meth:`SlurmJobCluster.take_refusals`. Awaiting a job starts it through the seam module's
``start_once`` (seam ``process_interface_start``: distributed's own ``__await__`` asserts
that a start leaves the job running). While a notebook waits for workers,
:meth:`SlurmJobCluster.check_jobs` says in one line a job that was refused or ended.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
from collections.abc import Iterator

from dask_jobqueue.slurm import SLURMCluster, SLURMJob
from distributed.core import Status

from spillway import upstream
from spillway.options.errors import ClusterStartError, OptionsError
from spillway.options.settings import Options

from . import commands
from .batch import JobSettings, JobStatus
from .gpu_worker import DEATH_TIMEOUT_S
from .http_server import free_dashboard_address, scheduler_without_http
from .plan import LaunchPlan, ucxx_installed
from .slurm_batch import Slurm
from .spec import WorkerSpec


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


def scheduler_options(options: Options) -> dict:
    """The keywords of the scheduler this process runs, from the options: where it listens
    (its host or interface), its port and its dashboard (dask-jobqueue's default would serve
    the dashboard on every interface)."""
    where = {"interface": options.interface} if options.interface else {"host": options.host}
    dashboard = ({"dashboard_address": free_dashboard_address(options.dashboard_address)}
                 if options.dashboard_address
                 else {"dashboard_address": None, "dashboard": False})
    return {**where, "port": options.scheduler_port, **dashboard}


class SlurmJobCluster(SLURMCluster):
    """Workers of ``options`` in Slurm jobs of ``job`` (one node each, ``nodes`` 1)."""

    job_cls = SlurmWorkerJob

    def __init__(self, options: Options, job: JobSettings, *, system: Slurm | None = None, **kwargs):
        self.system = system or Slurm()
        if job.nodes != 1:
            raise OptionsError(f"nodes: {job.nodes}; each job of a Slurm cluster is one node (scale(jobs=N) "
                               "asks for N)")
        job = dataclasses.replace(job, output_dir=os.path.abspath(job.output_dir))
        layout = self.system.layout(options, job)
        if layout.protocol == "ucx" and not ucxx_installed():
            raise OptionsError("protocol: the jobs' workers talk ucx, and their scheduler runs in this process, "
                               "which has no distributed-ucxx: install it here (pip install 'spillway[ucx]', "
                               "or the cuda12/cuda13 extra), or set protocol tcp")
        # sbatch does not make the directory of the job's output, and a job whose output has
        # nowhere to go ends at once and says nothing
        try:
            os.makedirs(job.output_dir, exist_ok=True)
        except OSError as e:
            raise OptionsError(f"output-dir: cannot make {job.output_dir!r} ([Errno {e.errno}] {e.strerror})") \
                from None
        self.spillway_options, self.spillway_job, self.layout = options, job, layout
        self._ready = False
        quiet = {} if options.dashboard_address else {"scheduler_cls": scheduler_without_http()}
        # dask-jobqueue needs cores and memory to build its own header and command, which
        # the job replaces with spillway's; processes makes its worker names the job's
        super().__init__(
            spillway_options=options, spillway_job=job, name=job.job_name,
            processes=layout.workers_per_node,
            cores=max(layout.workers_per_node, (layout.cpus_per_task or 0),
                      layout.workers_per_node * options.threads_per_worker),
            memory="1 GiB", protocol=layout.protocol, security=options.dask_security,
            scheduler_options=scheduler_options(options), death_timeout=DEATH_TIMEOUT_S, **quiet, **kwargs)

    def check_ready(self) -> None:
        """Slurm's commands are here and answer (once per cluster): else one line naming the
        command and what it said, before any job is submitted."""
        if not self._ready:
            self.system.check_ready()
            self._ready = True

    def take_refusals(self) -> list[str]:
        """Why sbatch refused jobs submitted so far, one line each; those jobs leave the spec,
        so the cluster neither counts nor waits for them."""
        refused = {name: job.refusal for name, job in self.workers.items() if getattr(job, "refusal", None)}
        if refused:
            for name in refused:
                self.worker_spec.pop(name, None)
            upstream.bring_to_spec(self)
        return list(refused.values())

    def job_ids(self) -> dict[str, str]:
        """The Slurm job id of each job submitted, by its name in the worker spec."""
        return {name: job.job_id for name, job in self.workers.items() if getattr(job, "job_id", None)}

    def job_states(self) -> dict[str, JobStatus]:
        """What Slurm says of each job submitted (squeue, or sacct once it has left the queue)."""
        return {name: self.system.status(job_id) for name, job_id in self.job_ids().items()}

    def output_of(self, job_id: str) -> str:
        """The file a job's output (its workers' log) goes to."""
        return os.path.join(self.spillway_job.output_dir, f"spillway-{job_id}.out")

    def raise_refusals(self) -> None:
        """One line for the jobs sbatch refused so far (:meth:`take_refusals`), if any."""
        refusals = self.take_refusals()
        if refusals:
            more = f" (and {len(refusals) - 1} more job(s) refused)" if len(refusals) > 1 else ""
            raise ClusterStartError(f"{refusals[0]}{more}")

    def check_jobs(self) -> dict[str, JobStatus]:
        """What Slurm says of each job (:meth:`job_states`) while workers are awaited: a job
        sbatch refused, or one that ended, fails the wait in one line naming the job, its
        state, the reason and its output file."""
        self.raise_refusals()
        states = self.job_states()
        for status in states.values():
            if not status.active and status.state != "UNKNOWN":
                raise ClusterStartError(self.job_said(status, "ended before its workers joined"))
        return states

    def waiting_for(self, states: dict[str, JobStatus]) -> str:
        """What the jobs ``states`` (:meth:`check_jobs`) wait for, in words, when the
        workers did not join in time."""
        waiting = [s for s in states.values() if s.state == "PENDING"]
        return (self.job_said(waiting[0], "is still pending") if waiting
                else f"{len(states)} job(s) submitted, none of them pending")

    def job_said(self, status: JobStatus, what: str) -> str:
        reason = f" ({status.reason})" if status.reason and status.reason not in ("None", "(null)") else ""
        exit_code = f", exit {status.exit_code}" if status.exit_code else ""
        return (f"Slurm job {status.job_id} {what}: {status.state}{reason}{exit_code}; "
                f"see {self.output_of(status.job_id)}")


class SlurmJobs:
    """Backend of a notebook's cluster of Slurm jobs: :meth:`start` returns the
    :class:`SlurmJobCluster` of ``job`` (one node a job) a client connects to, with no job
    submitted yet (``scale`` submits them). Each job's node resolves its own workers' spec
    (``spillway worker``), as in a batch job: ``specs`` is empty."""

    def __init__(self, job: JobSettings, *, system: Slurm | None = None):
        self.job, self.system = job, system

    def start(self, options: Options, launch: LaunchPlan, specs: tuple[WorkerSpec, ...] = ()) -> SlurmJobCluster:
        return SlurmJobCluster(options, self.job, system=self.system)


@contextlib.contextmanager
def open_jobs(options: Options, job: JobSettings, *, system: Slurm | None = None) -> Iterator:
    """The :class:`~spillway.launch.Session` of a new cluster of Slurm jobs of ``job``
    (:class:`SlurmJobs`), none submitted yet: its client, spillway's plugins registered on
    the scheduler (which hands them to every worker that joins). Leaving the context
    closes the client, then cancels the jobs."""
    from distributed import Client

    from .session import Session, register_plugins, stop_exchanging

    with contextlib.ExitStack() as stack:
        # the workers join from the jobs, and this process's client attaches to their scheduler
        jobs = SlurmJobs(job, system=system).start(options, LaunchPlan(kind="attach"), ())
        stack.callback(jobs.close)
        client = Client(jobs, security=options.dask_security)
        stack.callback(client.close)
        # registered with no worker yet: the scheduler hands them to every worker that joins
        register_plugins(client, options)
        stack.callback(stop_exchanging, client)
        plan = LaunchPlan(kind="attach", protocol=jobs.layout.protocol)
        yield Session(client=client, cluster=jobs, plan=plan, options=options, kind=jobs.layout.kind, n_workers=0)
