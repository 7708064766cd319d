"""The ``spillway`` command line.

Each command builds the one :class:`~spillway.cluster.options.Options` from its flags (generated
from the options object) and hands it on; errors in options or parameters print one line
and exit with status 2 before anything starts.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import signal
import sys
import threading

import click

from spillway.cluster.errors import SpillwayError
from .options import cluster_options, resolve, workflow_params

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def fail_cleanly(func):
    """Turn spillway's errors into one line on stderr and their exit status."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except SpillwayError as e:
            if not getattr(e, "said", False):
                click.echo(f"spillway: error: {e}", err=True)
            sys.exit(e.exit_code)
        except ModuleNotFoundError as e:
            click.echo(f"spillway: error: {missing_module(e)}", err=True)
            sys.exit(2)

    return wrapper


@contextlib.contextmanager
def said_before_close():
    """A worker lost during the run is said at once, not after the cluster's close (which
    waits for the nanny that is restarting it: seconds): fail_cleanly then says nothing
    more."""
    from spillway.cluster.errors import WorkerLost

    try:
        yield
    except WorkerLost as e:
        click.echo(f"spillway: error: {e}", err=True)
        e.said = True
        raise


#: which install extra brings a module that a command imports only when it runs
MODULE_EXTRAS = {"fastapi": "service", "uvicorn": "service", "sqlalchemy": "service", "httpx": "service",
                 "psycopg": "service", "prometheus_client": "service", "jinja2": "service",
                 "dask_mpi": "mpi", "mpi4py": "mpi"}


def missing_module(e: ModuleNotFoundError, command: str | None = None) -> str:
    """One line for a module that is not installed, with the extra that brings it."""
    name = (e.name or "").split(".")[0] or str(e)
    extra = MODULE_EXTRAS.get(name)
    what = f"{command} needs" if command else "this command needs"
    return f"{what} {name}, which is not installed" + (f": pip install 'spillway[{extra}]'" if extra else "")


class LazyGroup(click.Group):
    """Loads the heavier command groups (service, Slurm, bench) only when they are used,
    so ``spillway --help`` stays fast and imports no web or GPU library."""

    #: command name -> "module:attribute"
    lazy: dict[str, str] = {}

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx, name):
        if name in self.lazy and name not in self.commands:
            import importlib

            module, _, attr = self.lazy[name].partition(":")
            try:
                command = getattr(importlib.import_module(module), attr)
            except ModuleNotFoundError as e:
                click.echo(f"spillway: error: {missing_module(e, name)}", err=True)
                ctx.exit(2)
            self.add_command(command, name)
        return super().get_command(ctx, name)


# One line per lazily loaded command; each module owns its command.
LazyGroup.lazy.update({
    "bench": "spillway.cli.bench:bench",
    "bench-scaling": "spillway.cli.bench_scaling:bench_scaling",
    "serve": "spillway.cli.serve:serve",
    "tenant": "spillway.cli.serve:tenant",
    "slurm": "spillway.cli.slurm:slurm",
    "mpi": "spillway.cli.slurm:mpi",
    "worker": "spillway.cli.worker:worker",
})


@click.group(cls=LazyGroup, context_settings=CONTEXT)
@click.version_option(package_name="spillway")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def main(verbose):
    """spillway: chunked array workflows on a Dask-CUDA cluster, larger than any one GPU.

    \b
    Examples:
      spillway run transpose-sum                       # local cluster on all GPUs (or CPU)
      spillway run transpose-sum --param size=200GB --verify
      spillway up --scheduler-file-out sched.json      # keep a cluster up
      spillway run matmul --scheduler-file sched.json  # run on it
      spillway info                                    # GPUs, NVLink, installed stack
      spillway config --devices 0,1                    # effective options and sources
    """
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    # distributed logs every connection at INFO; people running a workflow want the result.
    # distributed sets its level from dask config when it is first imported, so set it there.
    import dask.config

    dask.config.set({"logging.distributed": logging.getLevelName(level).lower()})
    logging.getLogger("distributed").setLevel(level)
    logging.getLogger("spillway").setLevel(level)


@main.command(context_settings=CONTEXT)
@workflow_params
@click.option("--verify", is_flag=True, help="Compare with a NumPy float64 reference by relative error.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--output", default=None, metavar="PATH",
              help="Zarr v3 store the workers write an array result to, in parallel.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr (default: when stderr is a terminal).")
@cluster_options
@fail_cleanly
def run(workflow, params, verify, as_json, output, progress, options_flags):
    """Run WORKFLOW and print its report.

    Without --scheduler-address or --scheduler-file, starts the embedded default cluster
    (one worker per visible GPU, or CPU workers where there is none) and stops it after.

    \b
    Examples:
      spillway run transpose-sum --param size=20000x20000 --param chunks=5000x5000
      spillway run transpose-sum --param size=16GB --param dtype=float32 --verify --json
      spillway run transpose-sum --scheduler-file sched.json
      spillway run matmul --param size=8GB --output /scratch/z.zarr
    """
    from spillway import workflows
    from spillway.workflows.outputs import check_path

    from spillway.cluster.launch import open_cluster
    from spillway.run.preflight import refuse_before_start

    options = resolve(options_flags)
    # an unknown name or a bad value fails before a cluster starts
    workflows.get(workflow).check_values(params)
    if output is not None:
        output = check_path(output)
    # and so does a run no GPU worker's tiers could hold, before any pool is taken, and
    # before distributed is imported (the progress bar, the run): most of a refusal's second
    refuse_before_start(options, workflow, params)
    from spillway.run.progress import default_stream
    from spillway.run.compute import run_workflow
    from spillway.run.text import format_report

    stream = default_stream() if progress is None else (sys.stderr if progress else None)
    if as_json:
        from .stdout import JsonStdout

        # the cluster's processes and UCX's C code print to fd 1 too: only the report may
        with JsonStdout(restore=False) as out:
            with open_cluster(options) as session, said_before_close():
                report = run_workflow(session, workflow, params, verify=verify, progress=stream, output=output)
            out.emit(json.dumps(report, default=str))
    else:
        with open_cluster(options) as session, said_before_close():
            report = run_workflow(session, workflow, params, verify=verify, progress=stream, output=output)
        click.echo(format_report(report))
    if verify and report["verify"] and report["verify"]["ok"] is False:
        sys.exit(1)


@main.command(context_settings=CONTEXT)
@click.option("--scheduler-file-out", default="spillway-scheduler.json", show_default=True,
              help="Where to write the scheduler file that clients and `run` attach with.")
@cluster_options
@fail_cleanly
def up(scheduler_file_out, options_flags):
    """Start a cluster and keep it up until Ctrl-C or SIGTERM.

    \b
    Examples:
      spillway up                                  # all GPUs, ucx with NVLink when there are 2+
      spillway up --devices 0,1 --rmm-pool-size 100GB --device-memory-limit 120GB
      spillway up --cpu --n-workers 4 --dashboard-address :8790
    """
    from spillway.cluster.launch import open_cluster

    options = resolve(options_flags)
    if options.attach:
        raise click.UsageError("up starts a cluster; --scheduler-address/--scheduler-file attach to one")
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with open_cluster(options) as session:
            session.write_scheduler_file(scheduler_file_out)
            click.echo(f"scheduler       {session.scheduler_address}")
            click.echo(f"dashboard       {session.dashboard_link or 'off'}")
            click.echo(f"workers         {session.n_workers} ({session.kind}, {session.plan.protocol})")
            click.echo(f"scheduler file  {scheduler_file_out}")
            click.echo("press Ctrl-C to stop", err=True)
            while not stop.wait(0.5):
                pass
            click.echo("shutting down", err=True)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@main.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print as one JSON object.")
def info(as_json):
    """GPUs, their memory, NVLink links between each pair, driver and CUDA versions, and
    which parts of the GPU stack are installed. Creates no CUDA context.

    \b
    Example:
      spillway info --json
    """
    from spillway.cluster.info import collect, format_info

    data = collect()
    click.echo(json.dumps(data, indent=2) if as_json else format_info(data))


@main.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print as one JSON object.")
@cluster_options
@fail_cleanly
def config(as_json, options_flags):
    """The effective cluster options and where each value came from.

    \b
    Examples:
      spillway config
      DASK_SPILLWAY__RMM_POOL_SIZE=20GB spillway config --protocol tcp
    """
    from spillway.cluster.options import fields

    options = resolve(options_flags)
    values = options.as_config()
    rows = {f.replace("_", "-"): {"value": values[f.replace("_", "-")], "source": options.sources.get(f, "default")}
            for f in fields()}
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    width = max(map(len, rows))
    for key, row in rows.items():
        click.echo(f"{key:<{width}}  {str(row['value']):<24}  {row['source']}")


@main.command("workflows", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="List of objects with name, description and schema.")
@click.option("--gpu", is_flag=True, help="Show the defaults used on GPU workers.")
def workflows_command(as_json, gpu):
    """List the workflow catalogue.

    \b
    Examples:
      spillway workflows
      spillway workflows --json --gpu
    """
    from spillway import workflows as registry
    from spillway.workflows.params import Target

    target = Target(kind="gpu" if gpu else "cpu")
    entries = registry.catalogue(target)
    if as_json:
        click.echo(json.dumps(entries, indent=2))
        return
    for entry in entries:
        click.echo(f"{entry['name']}\n    {entry['description']}")
        for pname, schema in entry["schema"]["properties"].items():
            inner = schema.get("anyOf", [schema])[0]
            default = schema.get("default", inner.get("default"))
            choices = inner.get("enum")
            allowed = f"one of {', '.join(dict.fromkeys(map(str, choices)))}; " if choices else ""
            click.echo(f"    --param {pname}=...  {schema.get('description', '')} ({allowed}default {default})")


if __name__ == "__main__":  # pragma: no cover
    main()
