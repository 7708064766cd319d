"""``spillway slurm``: batch analyses on Slurm, the CLI of the Slurm batch launcher
(:mod:`spillway.launch.slurm_batch`).

The commands read their flags into the same options object every other entry point
builds, plus the job's own settings, check the workflows' parameters, and call the
launcher: the batch script is rendered by :func:`spillway.launch.slurm_batch.job_script`;
``submit`` hands it to ``sbatch`` (:func:`spillway.launch.slurm_batch.submit`) and prints
the job id. The script waits for its workers with ``spillway wait-workers``
(:mod:`.wait_workers`), a command of its own that any batch system's script calls.
"""

from __future__ import annotations

import copy
import json
import os
import sys

import click

from .errors import fail_cleanly
from .group import CONTEXT
from .options import cluster_options, resolve, workflow_params
from .wait_workers import wait_workers


def job_options(func):
    """The flags of one batch job (workflow, its parameters and the job settings)."""
    decorators = [
        workflow_params,
        click.option("--then", "then_json", default=None, metavar="JSON",
                     help='More workflows to run after WORKFLOW on the same cluster, as a JSON list of '
                          '{"workflow": NAME, "params": {...}}.'),
        click.option("--nodes", type=int, required=True, help="Nodes of the job."),
        click.option("--gpus-per-node", type=int, required=True,
                     help="GPUs on each node, one worker each (0 with --cpu)."),
        click.option("--time", "walltime", required=True, metavar="HH:MM:SS", help="Wall time of the job."),
        click.option("--partition", default=None, help="Slurm partition."),
        click.option("--account", default=None, help="Slurm account to charge."),
        click.option("--qos", default=None, help="Slurm quality of service."),
        click.option("--job-name", default=None, help="Job name (default spillway-WORKFLOW)."),
        click.option("--cpus-per-task", type=int, default=None,
                     help="CPUs for each node's worker task (default on GPUs: threads + 1 per worker)."),
        click.option("--mem", default=None, help="Memory per node (500G; 0 for all of it)."),
        click.option("--output-dir", default=None,
                     help="Directory on the shared file system for the job output and results "
                          "(default: the current directory)."),
        click.option("--directive", "directives", multiple=True, metavar="OPTION",
                     help="Another sbatch option such as --constraint=h200 (repeatable)."),
        click.option("--setup", "setup", multiple=True, metavar="LINE",
                     help="Shell line run before the cluster starts, such as 'module load cuda' (repeatable)."),
        click.option("--python", default=None,
                     help="Python with spillway installed on the nodes (default: this one)."),
        click.option("--start-timeout", type=int, default=300, show_default=True,
                     help="Seconds to wait for the scheduler and all workers."),
        click.option("--verify/--no-verify", default=True, show_default=True,
                     help="Check the result against the NumPy float64 reference (computed on the batch node)."),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def _runs(workflow: str, params: dict, then_json: str | None, verify: bool) -> list:
    from spillway.launch.slurm_batch import Run

    runs = [Run(workflow, params, verify=verify)]
    try:
        more = json.loads(then_json) if then_json else []
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON ({e.msg} at character {e.pos})", param_hint="--then") from None
    if not isinstance(more, list):
        raise click.BadParameter("must be a JSON list", param_hint="--then")
    for i, entry in enumerate(more):
        if not isinstance(entry, dict) or not isinstance(entry.get("workflow"), str) \
                or not isinstance(entry.get("params", {}), dict) or set(entry) - {"workflow", "params"}:
            raise click.BadParameter(f"entry {i} must be {{\"workflow\": NAME, \"params\": {{...}}}}",
                                     param_hint="--then")
        runs.append(Run(entry["workflow"], entry.get("params", {}), verify=verify))
    return runs


def _job(workflow, params, then_json, nodes, gpus_per_node, walltime, partition, account, qos,
         job_name, cpus_per_task, mem, output_dir, directives, setup, python, start_timeout, verify,
         options_flags) -> tuple:
    """The options, job settings and runs of the flags, the runs' parameters checked."""
    from spillway import workflows
    from spillway.launch.slurm_batch import JobSettings, layout
    from spillway.workflows.params import Target

    options = resolve(options_flags)
    job = JobSettings(
        nodes=nodes, gpus_per_node=gpus_per_node, time=walltime, partition=partition, account=account,
        qos=qos, job_name=job_name or f"spillway-{workflow}", cpus_per_task=cpus_per_task, mem=mem,
        output_dir=os.path.abspath(output_dir or os.getcwd()), extra_directives=tuple(directives),
        setup=tuple(setup), python=python or sys.executable, start_timeout=start_timeout,
    )
    runs = _runs(workflow, params, then_json, verify)
    plan = layout(options, job)
    # bad parameters stop here, not hours later in the queue
    for run in runs:
        workflows.get(run.workflow).validate(run.params, Target(kind=plan.kind, n_workers=plan.n_workers))
    return options, job, runs


@click.group(context_settings=CONTEXT)
def slurm():
    """Batch analyses on Slurm: a scheduler on the first node, one worker per GPU on every
    node, the workflow run from the batch step and its report written next to the job
    output (OUTPUT_DIR/spillway-JOBID/).

    \b
    Examples:
      spillway slurm render transpose-sum --param size=200GB --nodes 2 --gpus-per-node 4 --time 01:00:00
      spillway slurm submit transpose-sum --nodes 2 --gpus-per-node 4 --time 01:00:00 -p gpu --account proj
      spillway slurm status 12345
      spillway slurm cancel 12345
    """


@slurm.command(context_settings=CONTEXT)
@job_options
@cluster_options
@fail_cleanly
def render(**kwargs):
    """Print the sbatch script for WORKFLOW."""
    from spillway.launch.slurm_batch import job_script

    options, job, runs = _job(**kwargs)
    script = job_script(options, job, runs)
    output_dir = job.output_dir
    if not os.path.isdir(output_dir):
        # sbatch does not make it, and a job whose output has nowhere to go fails without a
        # word (submit makes it); said on stderr, so the script on stdout stays whole
        click.echo(f"spillway: note: output-dir {output_dir!r} does not exist here; make it before the job "
                   f"starts (mkdir -p {output_dir}); sbatch does not", err=True)
    click.echo(script, nl=False)


@slurm.command(context_settings=CONTEXT)
@job_options
@cluster_options
@fail_cleanly
def submit(**kwargs):
    """Submit WORKFLOW as a batch job and print its job id."""
    from spillway.launch.slurm_batch import submit as submit_job

    click.echo(submit_job(*_job(**kwargs)))


@slurm.command(context_settings=CONTEXT)
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print as one JSON object.")
@fail_cleanly
def status(job_id, as_json):
    """The state of batch job JOB_ID (from squeue, or sacct once it has left the queue)."""
    from spillway.launch.slurm_batch import Slurm

    found = Slurm().status(job_id)
    if as_json:
        click.echo(json.dumps(found.to_json()))
        return
    parts = [f"job {found.job_id}", found.state]
    for label, value in (("elapsed", found.elapsed), ("limit", found.time_limit), ("nodes", found.nodes),
                         ("exit", found.exit_code), ("reason", found.reason)):
        if value:
            parts.append(f"{label} {value}")
    click.echo("  ".join(parts))


@slurm.command(context_settings=CONTEXT)
@click.argument("job_id")
@fail_cleanly
def cancel(job_id):
    """Cancel batch job JOB_ID; the job's trap stops its scheduler and workers."""
    from spillway.launch.slurm_batch import Slurm

    Slurm().cancel(job_id)
    click.echo(f"cancelled {job_id}")


# scripts rendered before `spillway wait-workers` existed call it here; kept out of the help
_old_wait_workers = copy.copy(wait_workers)
_old_wait_workers.hidden = True
slurm.add_command(_old_wait_workers, "wait-workers")
