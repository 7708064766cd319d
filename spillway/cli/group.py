"""The root ``spillway`` group: logging for every command, and the table of commands, each
loaded from the module that owns it when it is used."""

from __future__ import annotations

import logging

import click

from .errors import missing_module, usage_in_one_line

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class LazyGroup(click.Group):
    """Loads each command's module only when the command is used, so ``spillway --help``
    stays fast and imports no web or GPU library, and no command module imports this one
    back; says every usage error of a command in one line."""

    #: command name -> "module:attribute"
    lazy: dict[str, str] = {}

    def make_context(self, *args, **kwargs):
        with usage_in_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        # every subcommand (and its own subcommands) runs inside: their usage errors too
        with usage_in_one_line():
            return super().invoke(ctx)

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


# One line per command; each module owns its commands, loaded when one is used.
LazyGroup.lazy.update({
    "run": "spillway.cli.run:run",
    "up": "spillway.cli.run:up",
    "info": "spillway.cli.describe:info",
    "config": "spillway.cli.describe:config",
    "workflows": "spillway.cli.describe:workflows_command",
    "bench": "spillway.cli.bench:bench",
    "serve": "spillway.cli.serve:serve",
    "tenant": "spillway.cli.serve:tenant",
    "slurm": "spillway.cli.slurm:slurm",
    "mpi": "spillway.cli.mpi:mpi",
    "wait-workers": "spillway.cli.wait_workers:wait_workers",
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
