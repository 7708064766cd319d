"""``spillway worker``: this node's GPU workers for a running scheduler (a batch job's)."""

from __future__ import annotations

import click

from .errors import fail_cleanly
from .group import CONTEXT
from .options import cluster_options, resolve


@click.command(context_settings=CONTEXT)
@click.option("--death-timeout", type=click.FloatRange(min=1), default=None,
              help="Seconds the workers wait for a lost scheduler before they exit (default: a minute, "
                   "as in batch jobs).")
@click.option("--name", default=None, metavar="NAME",
              help="The workers' name: NAME with one worker, NAME-0, NAME-1, ... with several (a cluster "
                   "manager finds a job's workers by it).")
@cluster_options
@fail_cleanly
def worker(death_timeout, name, options_flags):
    """Start one worker per visible GPU (dask-cuda's CUDAWorker: RMM pool, CPU affinity,
    UCX), attached to --scheduler-file or --scheduler-address, with spillway's tiered
    store when memory-store is tiered; serve until the workers end or SIGTERM.

    This is what a batch job runs on each node (`spillway slurm render` writes it); the
    flags are the cluster options, so the workers are the ones the local GPU cluster starts.

    \b
    Example:
      spillway worker --scheduler-file sched.json --protocol ucx --pinned-pool-size 48GB
    """
    # the launch package imports distributed: not at import, so `spillway --help` stays light
    from spillway.launch import DEATH_TIMEOUT_S, run_node

    options = resolve(options_flags)
    if not options.attach:
        raise click.UsageError("worker: name the scheduler with --scheduler-file or --scheduler-address")
    run_node(options, death_timeout=DEATH_TIMEOUT_S if death_timeout is None else death_timeout, name=name)
