"""The seam every batch system plugs into, in the manner of dask-jobqueue's ``Job``: a
system is a subclass that fills in class attributes (its directives, step launchers,
commands and job-id syntax), and this base renders the job script from the options and
the job settings and drives the system's queue through its commands.

The script is rendered by :meth:`BatchSystem.job_script`, a pure function of its
arguments: nothing is read from the machine it is rendered on. The queue methods run
the system's commands through :attr:`BatchSystem.shell`, which tests replace.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Sequence

from spillway.options.errors import OptionsError
from spillway.options.settings import Options

from .. import commands
from . import script
from .errors import BatchError, JobIdError
from .job_settings import JobSettings, format_walltime
from .job_status import JobStatus
from .layout import Layout
from .refusals import refuse_options
from .run import Run
from .shell import Shell


class BatchSystem:
    """A batch system, described by its class attributes.

    The ``{name}`` fields of :attr:`directive_formats`, :attr:`scheduler_step` and
    :attr:`worker_step` are those of :meth:`fields`: ``job_name``, ``nodes``,
    ``gpus_per_node`` (unset in a CPU job), ``cpus_per_task``, ``mem``, ``walltime``
    (``HH:MM:SS``), ``partition``, ``account``, ``qos`` and ``output_dir``. A directive
    that names an unset value is left out, and so is such a word of a step. In the
    commands, ``{job_id}`` stands for the job.
    """

    #: the system's name in messages ("run this on a Slurm login node")
    name: str = "batch system"
    #: the start of each directive line of the script (``#SBATCH``)
    directive_prefix: str = ""
    #: each directive's option, in order; the job's extra directives follow them
    directive_formats: tuple[str, ...] = ()
    #: the environment variable that holds the job's id inside the script
    job_id_variable: str = ""
    #: the script's copy in the job's results folder
    script_name: str = "job.sh"
    #: what starts a step on the job's nodes and passes signals on to it (``srun``)
    step_launcher: str = ""
    #: the command line that starts one task on the first node, for the scheduler
    scheduler_step: str = ""
    #: a comment above the scheduler's step, empty for none
    scheduler_step_note: str = ""
    #: the command line that starts one task on every node, for that node's workers
    worker_step: str = ""
    worker_step_note: str = ""

    #: submits the script given on its standard input; prints the job id
    submit_command: tuple[str, ...] = ()
    #: the job id in what the submit command prints (group ``job_id``); None: the last
    #: line is the job id alone
    submitted_regexp: str | None = None
    #: asks the queue about ``{job_id}``; prints :attr:`status_fields`
    status_command: tuple[str, ...] = ()
    status_fields: tuple[str, ...] = ("job_id", "state")
    #: asked for a job that has left the queue, where the machine has it (accounting)
    history_command: tuple[str, ...] = ()
    history_fields: tuple[str, ...] = ("job_id", "state")
    #: between the fields of a status line
    field_separator: str = "|"
    #: the states of a job still queued or running
    active_states: frozenset[str] = frozenset()
    cancel_command: tuple[str, ...] = ()
    #: commands that must exit 0 before a job is submitted: each client answers, and the
    #: system's controller does (the first such command with no controller fails at once)
    probe_commands: tuple[tuple[str, ...], ...] = ()
    #: a whole job id, checked before it reaches a command line
    job_id_regexp: str = r"\d+"
    #: the job id's form in words, for the message on a bad one
    job_id_form: str = "digits"
    #: what a failing command raises
    error: type[BatchError] = BatchError

    def __init__(self, shell: Shell | None = None):
        self.shell = shell or Shell()

    def layout(self, options: Options, job: JobSettings) -> Layout:
        """Workers and transport of the job; options and combinations that cannot work
        stop here."""
        refuse_options(options, starter="a batch job", where="in a batch job",
                       gpus_from=f"{self.name} gives each node's task its GPUs (use gpus-per-node)")
        return Layout.of(options, job)

    def fields(self, job: JobSettings, job_layout: Layout) -> dict[str, object]:
        """The values the directive and step formats name."""
        return {
            "job_name": job.job_name,
            "nodes": job.nodes,
            "gpus_per_node": job.gpus_per_node if job_layout.kind == "gpu" else None,
            "cpus_per_task": job_layout.cpus_per_task,
            "mem": job.mem,
            "walltime": format_walltime(job.walltime_s),
            "partition": job.partition,
            "account": job.account,
            "qos": job.qos,
            "output_dir": job.output_dir,
        }

    def directives(self, job: JobSettings, job_layout: Layout) -> list[str]:
        """The script's directive lines: the system's, then the job's extra ones."""
        values = self.fields(job, job_layout)
        lines = [line for line in (script.fill(f, values) for f in self.directive_formats) if line is not None]
        return [f"{self.directive_prefix} {line}" for line in [*lines, *job.extra_directives]]

    def job_script(self, options: Options, job: JobSettings, runs: Sequence[Run]) -> str:
        """The script that runs ``runs`` on a cluster started inside the job."""
        if not runs:
            raise OptionsError("workflows: a batch job needs at least one workflow")
        job_layout = self.layout(options, job)
        values = self.fields(job, job_layout)
        scheduler = commands.scheduler_args(options, scheduler_file=script.SCHEDULER_FILE,
                                            protocol=job_layout.protocol, multi_node=job.nodes > 1)
        worker_command, worker, layout_text, environment = script.workers(options, job_layout)
        # the workers' dask config travels as DASK_ variables, which every process started here inherits
        environment = {**environment, **commands.worker_environment(options)}
        client = commands.client_args(options, scheduler_file=script.SCHEDULER_FILE)
        tls = client[2:]
        names = ", ".join(run.workflow for run in runs)
        per_node = (f"{job.gpus_per_node} GPUs" if job_layout.kind == "gpu"
                    else f"{job_layout.workers_per_node} CPU workers")
        summary = (f"{names} on {job.nodes} node(s) x {per_node} ({job_layout.n_workers} workers, "
                   f"{job_layout.protocol}), wall time {format_walltime(job.walltime_s)}")
        return script.render(dict(
            directives="\n".join(self.directives(job, job_layout)),
            summary=summary,
            worker_layout=layout_text,
            results_dir=shlex.quote(job.output_dir),
            job_id_variable=self.job_id_variable,
            script_name=self.script_name,
            python=shlex.quote(job.python),
            setup="\n".join(job.setup),
            lifetime=f"{job.lifetime_s}s",
            lifetime_margin=f"{job.walltime_s - job.lifetime_s}s",
            environment="\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(environment.items())),
            step_launcher=self.step_launcher,
            scheduler_step_note=self.scheduler_step_note,
            scheduler_step=script.fill_words(self.scheduler_step, values),
            scheduler_args=script.shell(scheduler),
            worker_step_note=self.worker_step_note,
            worker_step=script.fill_words(self.worker_step, values),
            worker_command=worker_command,
            worker_args=script.shell_lines(worker),
            n_workers=str(job_layout.n_workers),
            start_timeout=str(job.start_timeout),
            client_tls=f" {script.shell(tls)}" if tls else "",
            runs="\n".join(script.run_lines(runs, client)),
        ))

    def check_job_id(self, job_id: str) -> str:
        text = str(job_id).strip()
        if not re.fullmatch(self.job_id_regexp, text):
            raise JobIdError(f"job id: {job_id!r} is not a {self.name} job id ({self.job_id_form})")
        return text

    def job_id_from_submit(self, output: str) -> str:
        """The job id in the submit command's ``output``."""
        lines = output.strip().splitlines()
        regexp = self.submitted_regexp or rf"(?P<job_id>{self.job_id_regexp})"
        found = re.fullmatch(regexp, lines[-1].strip()) if lines else None
        if found is None:
            raise self.error(f"{self.submit_command[0]} printed no job id: {output.strip()!r}")
        return found.group("job_id")

    def parse_status(self, output: str, job_id: str) -> JobStatus | None:
        """The job in the status command's ``output`` (lines of :attr:`status_fields`);
        None where it has no line. A system whose output is not such lines overrides it."""
        return self._parse_lines(output, job_id, self.status_fields, self.status_command[0])

    def parse_history(self, output: str, job_id: str) -> JobStatus | None:
        """As :meth:`parse_status`, for the history command's ``output``."""
        return self._parse_lines(output, job_id, self.history_fields, self.history_command[0])

    def _parse_lines(self, output: str, job_id: str, fields: Sequence[str], source: str) -> JobStatus | None:
        # the job's own line, not its steps' (17.batch)
        for line in output.splitlines():
            parts = line.strip().split(self.field_separator)
            if len(parts) != len(fields):
                continue
            row = dict(zip(fields, parts))
            if row["job_id"] == job_id:
                # some systems follow the state with more words ("CANCELLED by 0")
                row["state"] = row["state"].split()[0] if row["state"].strip() else "UNKNOWN"
                return JobStatus(**row, source=source, active=row["state"] in self.active_states)
        return None

    def submit(self, text: str) -> str:
        """Submit the script ``text``; returns the job id."""
        done = self._call(self.submit_command, input=text)
        if done.returncode != 0:
            raise self._failed(self.submit_command[0], done)
        return self.job_id_from_submit(done.stdout)

    def status(self, job_id: str) -> JobStatus:
        job_id = self.check_job_id(job_id)
        done = self._call(self.status_command, job_id=job_id)
        found = self.parse_status(done.stdout, job_id) if done.returncode == 0 else None
        if found is not None:
            return found
        if self.history_command and self.shell.which(self.history_command[0]) is not None:
            done = self._call(self.history_command, job_id=job_id)
            found = self.parse_history(done.stdout, job_id) if done.returncode == 0 else None
            if found is not None:
                return found
        # a queue forgets finished jobs after a while; without accounting nothing else knows
        return JobStatus(job_id=job_id, state="UNKNOWN", source="none",
                         reason="not in the queue (finished a while ago, or never submitted) and no accounting record")

    def cancel(self, job_id: str) -> None:
        job_id = self.check_job_id(job_id)
        done = self._call(self.cancel_command, job_id=job_id)
        if done.returncode != 0:
            raise self._failed(self.cancel_command[0], done)

    def check_ready(self) -> None:
        """Before anything is submitted: the submit, status and cancel commands are on the
        PATH and each of :attr:`probe_commands` exits 0, else one line naming the command
        and what it said (exit 2: the machine is the user's to change)."""
        for command in (self.submit_command, self.status_command, self.cancel_command):
            if command:
                self.require(command)
        for command in self.probe_commands:
            done = self._call(command)
            if done.returncode != 0:
                raise self.error(f"{self.name} does not answer here: {self._failed(command[0], done)}", exit_code=2)

    def require(self, command: Sequence[str]) -> str:
        """The path of ``command``'s program; where it is not on the PATH, one line saying
        so (exit 2), before anything is made for the job."""
        name = command[0]
        path = self.shell.which(name)
        if path is None:
            raise self.error(f"{name}: not found on the PATH; run this on a {self.name} login node", exit_code=2)
        return path

    def _call(self, command: Sequence[str], *, job_id: str | None = None,
              input: str | None = None) -> subprocess.CompletedProcess:
        path = self.require(command)
        args = [path, *(a if job_id is None else a.replace("{job_id}", job_id) for a in command[1:])]
        try:
            return self.shell.run(args, input=input)
        except subprocess.TimeoutExpired:
            raise self.error(f"{path}: no answer within {self.shell.timeout_s}s") from None

    def _failed(self, name: str, done: subprocess.CompletedProcess) -> BatchError:
        message = (done.stderr or done.stdout).strip().splitlines()
        return self.error(f"{name} failed (exit {done.returncode}): {message[-1] if message else 'no output'}")
