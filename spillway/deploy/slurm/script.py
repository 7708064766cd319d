"""The sbatch script of a batch analysis, rendered by a pure function.

``job_script(options, job, runs)`` returns the script text from the cluster options, the
job settings and the workflows to run, in the manner of dask-jobqueue's
``job_script()``: nothing is read from the machine it is rendered on, so the same inputs
always give the same script and the tests check it as text.
"""

from __future__ import annotations

import json
import shlex
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spillway.cluster.errors import OptionsError
from spillway.cluster.launch import off_node_spec
from spillway.cluster.options import Options

from .. import commands
from .job import JobSettings, format_walltime

TEMPLATE_FILE = Path(__file__).with_name("job.sh.tmpl")

#: stands for the job's scheduler file, a shell variable that must not be quoted away
_SCHEDULER_FILE = "\0SCHEDULER_FILE"


class _ScriptTemplate(string.Template):
    # only @{name} is a placeholder, so bash's own $ and @ pass through untouched
    pattern = r"@\{(?P<braced>[a-z_]+)\}|(?P<escaped>@@\{)|(?P<named>(?!))|(?P<invalid>(?!))"


@dataclass(frozen=True)
class Run:
    """One workflow of the batch with its raw parameters (checked by the workflow)."""

    workflow: str
    params: Mapping[str, Any] = field(default_factory=dict)
    #: compare with the NumPy float64 reference (regenerated on the batch node's CPU)
    verify: bool = True


@dataclass(frozen=True)
class Layout:
    """What the job starts, derived from the options and the job settings."""

    kind: str  # "gpu" or "cpu"
    workers_per_node: int
    n_workers: int
    protocol: str
    #: CPUs of each node's worker task, or None for Slurm's default
    cpus_per_task: int | None = None


def layout(options: Options, job: JobSettings) -> Layout:
    """Workers and transport of the job; combinations that cannot work stop here."""
    if options.attach:
        raise OptionsError("scheduler-address/scheduler-file: a batch job starts its own scheduler; unset them")
    if options.devices is not None:
        raise OptionsError(
            f"devices: {','.join(map(str, options.devices))} cannot be chosen in a batch job; "
            "Slurm gives each node's task its GPUs (use gpus-per-node)"
        )
    if options.cpu:
        if job.gpus_per_node:
            raise OptionsError(f"gpus-per-node: {job.gpus_per_node} GPUs requested but cpu is true; use 0")
        total = options.n_workers or job.nodes
        if total % job.nodes:
            raise OptionsError(f"n-workers: {total} does not split evenly over {job.nodes} nodes")
        per_node = total // job.nodes
        return Layout("cpu", per_node, total, commands.protocol(options, gpu=False, n_workers=total),
                      cpus_per_task=job.cpus_per_task)
    if not job.gpus_per_node:
        raise OptionsError("gpus-per-node: 0 GPUs gives no GPU workers; request GPUs or set cpu true")
    per_node = job.gpus_per_node * options.workers_per_gpu
    total = job.nodes * per_node
    if options.n_workers is not None and options.n_workers != total:
        raise OptionsError(
            f"n-workers: {options.n_workers} does not match {job.nodes} nodes x {job.gpus_per_node} GPUs "
            f"x {options.workers_per_gpu} worker(s) per GPU ({total}); leave it unset"
        )
    # Slurm's default is one CPU per task: too few for a worker per GPU under task/cgroup
    cpus = job.cpus_per_task or per_node * (options.threads_per_worker + 1)
    return Layout("gpu", per_node, total, commands.protocol(options, gpu=True, n_workers=total),
                  cpus_per_task=cpus)


def _shell(args: Sequence[str]) -> str:
    return " ".join('"$SCHEDULER_FILE"' if a == _SCHEDULER_FILE else shlex.quote(str(a)) for a in args)


def _shell_lines(args: Sequence[str], indent: str = "    ", width: int = 100) -> str:
    """``_shell(args)`` continued over lines of about ``width`` characters, a flag and its
    value kept together."""
    words, i = [], 0
    while i < len(args):
        take = 2 if args[i].startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--") else 1
        words.append(_shell(args[i:i + take]))
        i += take
    lines, line = [], ""
    for word in words:
        if line and len(indent) + len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return f" \\\n{indent}".join(lines)


def _directives(job: JobSettings, job_layout: Layout) -> list[str]:
    lines = [f"--job-name={job.job_name}", f"--nodes={job.nodes}", "--ntasks-per-node=1"]
    if job_layout.kind == "gpu":
        lines.append(f"--gpus-per-node={job.gpus_per_node}")
    if job_layout.cpus_per_task is not None:
        lines.append(f"--cpus-per-task={job_layout.cpus_per_task}")
    if job.mem is not None:
        lines.append(f"--mem={job.mem}")
    lines.append(f"--time={format_walltime(job.walltime_s)}")
    for key in ("partition", "account", "qos"):
        value = getattr(job, key)
        if value:
            lines.append(f"--{key}={value}")
    lines.append(f"--output={job.output_dir}/spillway-%j.out")
    lines.extend(job.extra_directives)
    return [f"#SBATCH {line}" for line in lines]


def _run_lines(runs: Sequence[Run], client: list[str]) -> list[str]:
    lines = []
    width = max(2, len(str(len(runs))))
    for i, run in enumerate(runs, 1):
        stem = f"{i:0{width}d}-{run.workflow}"
        args = ["run", run.workflow, "--params-json", json.dumps(dict(run.params), sort_keys=True),
                *(["--verify"] if run.verify else []), "--json", "--no-progress", *client]
        lines += [
            f"# {i}/{len(runs)}: {run.workflow}; the report is one JSON object",
            f'"$PYTHON" -m spillway {_shell(args)} \\',
            f'  >"$RESULTS/{stem}.json" 2>"$RESULTS/{stem}.log" &',
            f'wait $! || {{ status=1; echo "spillway: {stem} failed; see $RESULTS/{stem}.log" >&2; }}',
        ]
    return lines


def job_script(options: Options, job: JobSettings, runs: Sequence[Run]) -> str:
    """The sbatch script that runs ``runs`` on a cluster started inside the job."""
    if not runs:
        raise OptionsError("workflows: a batch job needs at least one workflow")
    job_layout = layout(options, job)
    multi_node = job.nodes > 1
    scheduler = commands.scheduler_args(options, scheduler_file=_SCHEDULER_FILE, protocol=job_layout.protocol,
                                        multi_node=multi_node)
    # the workers' settings as far as they are known here: the nodes' GPUs and memory are not
    spec = (off_node_spec(options, protocol=job_layout.protocol, workers=job_layout.workers_per_node)
            if job_layout.kind == "gpu" else None)
    if spec is not None and (spec.tiered or spec.workers_per_gpu > 1):
        # dask-cuda's command has no flag for another store, nor for several workers on a
        # GPU: spillway's own runs its CUDAWorker, and resolves the workers' spec from
        # these options on the node
        worker_command = "spillway"
        worker = commands.spillway_worker_args(options, scheduler_file=_SCHEDULER_FILE, protocol=job_layout.protocol)
        store = "tiered-store" if spec.tiered else "dask-cuda"
        layout_text = (f"one {store} worker per GPU" if spec.workers_per_gpu == 1
                       else f"{spec.workers_per_gpu} {store} workers per GPU")
        environment = commands.ucx_environment(options) if job_layout.protocol == "ucx" else {}
    elif spec is not None:
        worker_command = "dask cuda worker"
        worker = commands.gpu_worker_args(spec, scheduler_file=_SCHEDULER_FILE)
        layout_text = "one dask-cuda worker per GPU"
        environment = commands.ucx_environment(options) if job_layout.protocol == "ucx" else {}
    else:
        worker_command = "dask worker"
        worker = commands.cpu_worker_args(options, scheduler_file=_SCHEDULER_FILE, protocol=job_layout.protocol,
                                          n_workers=job_layout.workers_per_node)
        layout_text = f"{job_layout.workers_per_node} CPU worker(s) with NumPy chunks"
        environment = {}
    # the workers' dask config travels as DASK_ variables, which every process started here inherits
    environment.update(commands.worker_environment(options))
    client = commands.client_args(options, scheduler_file=_SCHEDULER_FILE)
    tls = client[2:]
    names = ", ".join(run.workflow for run in runs)
    per_node = f"{job.gpus_per_node} GPUs" if job_layout.kind == "gpu" else f"{job_layout.workers_per_node} CPU workers"
    summary = (f"{names} on {job.nodes} node(s) x {per_node} ({job_layout.n_workers} workers, {job_layout.protocol}), "
               f"wall time {format_walltime(job.walltime_s)}")
    margin = job.walltime_s - job.lifetime_s
    env_lines = [f"export {k}={shlex.quote(v)}" for k, v in sorted(environment.items())]
    text = _ScriptTemplate(TEMPLATE_FILE.read_text()).substitute(
        directives="\n".join(_directives(job, job_layout)),
        summary=summary,
        worker_layout=layout_text,
        results_dir=shlex.quote(job.output_dir),
        python=shlex.quote(job.python),
        setup="\n".join(job.setup),
        lifetime=f"{job.lifetime_s}s",
        lifetime_margin=f"{margin}s",
        environment="\n".join(env_lines),
        scheduler_args=_shell(scheduler),
        nodes=str(job.nodes),
        # named again on the step: srun does not take the job's CPUs per task from it in every version
        worker_cpus=f" --cpus-per-task={job_layout.cpus_per_task}" if job_layout.cpus_per_task else "",
        worker_command=worker_command,
        worker_args=_shell_lines(worker),
        n_workers=str(job_layout.n_workers),
        start_timeout=str(job.start_timeout),
        client_tls=f" {_shell(tls)}" if tls else "",
        runs="\n".join(_run_lines(runs, client)),
    )
    # empty placeholders (no setup, no environment) would leave blank runs of lines
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text
