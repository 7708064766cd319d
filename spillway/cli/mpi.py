"""``spillway mpi``: a workflow on a cluster started by MPI (dask-mpi), one worker per rank;
the CLI of the MPI launcher (:mod:`spillway.launch.mpi`)."""

from __future__ import annotations

import json
import logging
import os
import sys

import click

from .errors import fail_cleanly
from .group import CONTEXT
from .options import cluster_options, resolve, workflow_params


@click.command(context_settings=CONTEXT)
@workflow_params
@click.option("--verify", is_flag=True, help="Compare with a NumPy float64 reference by relative error.")
@click.option("--report", "report_path", default=None, metavar="FILE",
              help="Also write the report as JSON to FILE (from rank 0).")
@cluster_options
@fail_cleanly
def mpi(workflow, params, verify, report_path, options_flags):
    """Run WORKFLOW on a cluster started by MPI (dask-mpi): rank 0 runs the scheduler and
    the workflow, every other rank one worker (one GPU each, or CPU workers with --cpu).

    \b
    Examples:
      mpirun -n 9 spillway mpi transpose-sum --param size=200GB --verify
      srun --mpi=pmix -N 2 --ntasks-per-node=5 --gpus-per-node=4 spillway mpi transpose-sum
      mpirun -n 3 spillway mpi transpose-sum --cpu --verify
    """
    from spillway import workflows
    from spillway.launch import mpi as launch
    from spillway.run.compute import run_workflow

    options = resolve(options_flags)
    # a worker rank's nanny starts its worker in a process of its own, which sets distributed's
    # log level from the environment as it imports it: the level this command runs at (its
    # INFO lines, and the tracebacks of comms closed at shutdown, would bury the report)
    level = logging.getLevelName(logging.getLogger("distributed").getEffectiveLevel()).lower()
    loggers = {"distributed": level}
    if level == "warning":
        # and a worker whose nanny ends with the cluster logs its end as a death, with a
        # traceback, from the thread that waited on the nanny (the real deaths of a run reach
        # rank 0 from the scheduler, which says them in one line)
        loggers["distributed.nanny"] = "critical"
    # one variable: dask would nest DASK_LOGGING__DISTRIBUTED.NANNY under the first one's value
    os.environ.setdefault("DASK_LOGGING", json.dumps(loggers))
    workflows.get(workflow)  # an unknown name fails on every rank before anything starts
    from spillway.run.progress import line_writer

    # the scheduler's line on a run past device + host goes to stderr: stdout is the report's
    say = line_writer(sys.stderr)
    report = launch.run(options, lambda session: run_workflow(session, workflow, params, verify=verify, say=say))
    if report is None:  # scheduler-less ranks (the workers) end here
        return
    text = json.dumps(report, default=str)
    if report_path:
        with open(report_path, "w") as f:
            f.write(text + "\n")
    click.echo(text)
    if verify and report["verify"] and report["verify"]["ok"] is False:
        sys.exit(1)
