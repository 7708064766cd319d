"""``spillway wait-workers``: wait until a cluster has its workers. A batch job's script
calls it between starting the workers and running the workflows, whatever the batch
system (``spillway slurm wait-workers`` is the name older Slurm scripts call)."""

from __future__ import annotations

import sys

import click

from .errors import fail_cleanly
from .group import CONTEXT


@click.command(context_settings=CONTEXT)
@click.option("--scheduler-file", required=True, help="Scheduler file of the job's cluster.")
@click.option("--workers", type=click.IntRange(1), required=True, help="Workers to wait for.")
@click.option("--timeout", type=click.IntRange(1), default=300, show_default=True, help="Seconds to wait.")
@click.option("--tls-ca-file", default=None, help="CA certificate, as for the cluster.")
@click.option("--tls-cert", default=None, help="Certificate, as for the cluster.")
@click.option("--tls-key", default=None, help="Private key, as for the cluster.")
@fail_cleanly
def wait_workers(scheduler_file, workers, timeout, tls_ca_file, tls_cert, tls_key):
    """Wait until the cluster has WORKERS workers (used by the batch script); exit 1
    with the count reached when TIMEOUT runs out.

    \b
    Example:
      spillway wait-workers --scheduler-file "$RESULTS/scheduler.json" --workers 8 --timeout 300
    """
    from distributed import Client

    from spillway.options.settings import Options

    options = Options.resolve(scheduler_file=scheduler_file, tls_ca_file=tls_ca_file, tls_cert=tls_cert,
                              tls_key=tls_key)
    with Client(scheduler_file=scheduler_file, security=options.dask_security, timeout=f"{timeout}s") as client:
        try:
            client.wait_for_workers(workers, timeout=timeout)
        except TimeoutError:
            from spillway.launch import scheduler_workers

            have = len(scheduler_workers(client))
            click.echo(f"spillway: error: {have} of {workers} workers after {timeout}s", err=True)
            sys.exit(1)
        click.echo(f"{workers} workers up at {client.scheduler.address}")
