"""``spillway run`` (one workflow, its report) and ``spillway up`` (a cluster kept up for
others to attach to)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import time

import click

from .errors import fail_cleanly, said_before_close
from .interrupts import stopping
from .group import CONTEXT
from .options import cluster_options, resolve, workflow_params


@click.command(context_settings=CONTEXT)
@workflow_params
@click.option("--verify", is_flag=True, help="Compare with a NumPy float64 reference by relative error.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--output", default=None, metavar="PATH",
              help="Zarr v3 store the workers write an array result to, in parallel.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr (default: when stderr is a terminal).")
@cluster_options(brief=True)
@fail_cleanly
def run(workflow, params, verify, as_json, output, progress, options_flags):
    """Run WORKFLOW and print its report.

    Without --scheduler-address or --scheduler-file, starts the embedded default cluster
    (one worker per visible GPU, or CPU workers where there is none) and stops it after.
    The workflows and their parameters: `spillway workflows` (`--json` for the schemas).
    Shown below are the cluster flags people change most; every other one (`spillway config
    --help` lists them all) is accepted here too.

    \b
    Examples:
      spillway run transpose-sum --param size=20000x20000 --param chunks=5000x5000
      spillway run transpose-sum --param size=16GB --param dtype=float32 --verify --json
      spillway run transpose-sum --scheduler-file sched.json
      spillway run matmul --param size=8GB --output /scratch/z.zarr
    """
    from spillway.launch import open_cluster
    from spillway.run.preflight import refuse_before_start

    options = resolve(options_flags)
    # an unknown name, a bad value, parameters that do not go together, an output that
    # cannot be written and a run no GPU worker's tiers could hold all fail before a
    # cluster starts, and before distributed is imported (the progress bar, the run):
    # most of a refusal's second
    output = refuse_before_start(options, workflow, params, output)
    from spillway.run.progress import default_stream, line_writer
    from spillway.run.compute import run_workflow
    from spillway.run.text import format_report

    stream = default_stream() if progress is None else (sys.stderr if progress else None)
    # the scheduler's line on a run past device + host (its disk traffic, how long) goes
    # where the progress goes, bar or not: stdout holds the report alone
    say = line_writer(sys.stderr)

    began = []

    def compute():
        with stopping(f"{workflow} as its cluster started") as stop:
            with open_cluster(options) as session, said_before_close():
                began.append(True)
                stop.what = stopped_run(workflow, session, output)
                return run_workflow(session, workflow, params, verify=verify, progress=stream, output=output,
                                    say=say)

    try:
        if as_json:
            from .stdout import JsonStdout

            # the cluster's processes and UCX's C code print to fd 1 too: only the report may
            with JsonStdout(restore=False) as out:
                report = compute()
                out.emit(json.dumps(report, default=str))
        else:
            report = compute()
            click.echo(format_report(report))
    except KeyboardInterrupt:
        if output is not None and began:
            from spillway.workflows.outputs import remove_output

            # again, now that no worker of this run writes there: a chunk written after the
            # run's own clean-up would have made the directory again (a store to be replaced
            # is left as it was where the run never began)
            remove_output(output)
        raise
    if verify and report["verify"] and report["verify"]["ok"] is False:
        sys.exit(1)


def stopped_run(workflow: str, session, output: str | None) -> str:
    """What an interrupt of the run stops, for its one line."""
    where = (f"its {session.n_workers} {session.kind.upper()} worker{'s' if session.n_workers != 1 else ''} "
             "and scheduler" if session.plan.kind != "attach" else f"its tasks on {session.scheduler_address}")
    return f"{workflow}, {where}" + (f"; nothing left at {output}" if output else "")


@click.command(context_settings=CONTEXT)
@click.option("--scheduler-file-out", default="spillway-scheduler.json", show_default=True,
              help="Where to write the scheduler file that clients and `run` attach with.")
@cluster_options(brief=True)
@fail_cleanly
def up(scheduler_file_out, options_flags):
    """Start a cluster and keep it up until Ctrl-C or SIGTERM.

    \b
    Examples:
      spillway up                                  # all GPUs, ucx with NVLink when there are 2+
      spillway up --devices 0,1 --rmm-pool-size 100GB --device-memory-limit 120GB
      spillway up --cpu --n-workers 4 --dashboard-address :8790
    """
    from spillway.launch import open_cluster

    from spillway.options.errors import OptionsError

    options = resolve(options_flags)
    if options.attach:
        raise click.UsageError("up starts a cluster; --scheduler-address/--scheduler-file attach to one")
    # written once the cluster is up: a place it cannot go is refused before it starts
    where = os.path.dirname(os.path.abspath(scheduler_file_out))
    try:
        tempfile.TemporaryFile(dir=where).close()
    except OSError as e:
        raise OptionsError(f"scheduler-file-out: cannot write in {where!r} ([Errno {e.errno}] {e.strerror})") from None
    written = False
    # Ctrl-C is KeyboardInterrupt, SIGTERM (a service manager's stop: exit 0) Terminated;
    # either closes the cluster and removes the file, and is said in one line. SIGINT is
    # how `up` is stopped even where it was started with it ignored (`spillway up &` in a
    # script, then `kill -INT`)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    with stopping("the cluster as it started", sigterm_exit=0) as stop:
        try:
            with open_cluster(options) as session:
                stop.what = (f"the cluster at {session.scheduler_address} ({session.n_workers} "
                             f"{session.kind.upper()} worker{'s' if session.n_workers != 1 else ''})")
                session.write_scheduler_file(scheduler_file_out)
                written = True
                stop.what += f" and removed {scheduler_file_out}"
                click.echo(f"scheduler       {session.scheduler_address}")
                click.echo(f"dashboard       {session.dashboard_link or 'off'}")
                click.echo(f"workers         {session.n_workers} ({session.kind}, {session.plan.protocol})")
                click.echo(f"scheduler file  {scheduler_file_out}")
                click.echo("press Ctrl-C to stop", err=True)
                while True:
                    time.sleep(3600)
        finally:
            # the file names a scheduler that is gone now: a later --scheduler-file would wait on it
            if written:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(scheduler_file_out)
            signal.signal(signal.SIGINT, previous)
