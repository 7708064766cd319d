"""``spillway run`` (one workflow, its report) and ``spillway up`` (a cluster kept up for
others to attach to)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import threading

import click

from .errors import fail_cleanly, said_before_close
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
    if as_json:
        from .stdout import JsonStdout

        # the cluster's processes and UCX's C code print to fd 1 too: only the report may
        with JsonStdout(restore=False) as out:
            with open_cluster(options) as session, said_before_close():
                report = run_workflow(session, workflow, params, verify=verify, progress=stream, output=output,
                                      say=say)
            out.emit(json.dumps(report, default=str))
    else:
        with open_cluster(options) as session, said_before_close():
            report = run_workflow(session, workflow, params, verify=verify, progress=stream, output=output,
                                  say=say)
        click.echo(format_report(report))
    if verify and report["verify"] and report["verify"]["ok"] is False:
        sys.exit(1)


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
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    written = False
    try:
        with open_cluster(options) as session:
            session.write_scheduler_file(scheduler_file_out)
            written = True
            click.echo(f"scheduler       {session.scheduler_address}")
            click.echo(f"dashboard       {session.dashboard_link or 'off'}")
            click.echo(f"workers         {session.n_workers} ({session.kind}, {session.plan.protocol})")
            click.echo(f"scheduler file  {scheduler_file_out}")
            click.echo("press Ctrl-C to stop", err=True)
            while not stop.wait(0.5):
                pass
            click.echo("shutting down", err=True)
    finally:
        # the file names a scheduler that is gone now: a later --scheduler-file would wait on it
        if written:
            with contextlib.suppress(FileNotFoundError):
                os.remove(scheduler_file_out)
        for s, handler in previous.items():
            signal.signal(s, handler)
