"""How the command line fails: spillway's errors and click's usage errors as one line on
stderr with their exit status, a module that is not installed named with the extra that
brings it, and an interrupt as one line of what it stopped."""

from __future__ import annotations

import contextlib
import functools
import sys

import click

from spillway.options.errors import SpillwayError


def fail_cleanly(func):
    """Turn spillway's errors into one line on stderr and their exit status, and Ctrl-C or
    SIGTERM into one line of what the command stopped (:mod:`.interrupts`)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from .interrupts import say_stopped, sigterm_as_interrupt

        try:
            with sigterm_as_interrupt():
                return func(*args, **kwargs)
        except KeyboardInterrupt as e:
            sys.exit(say_stopped(e))
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
    from spillway.options.errors import WorkerLost

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

#: modules that are no extra of spillway's, and how to install them
MODULE_INSTALLS = {"spillway_bench": "pip install -e ./benchmarks (from a spillway checkout)"}


def missing_module(e: ModuleNotFoundError, command: str | None = None) -> str:
    """One line for a module that is not installed, with the extra that brings it."""
    name = (e.name or "").split(".")[0] or str(e)
    extra = MODULE_EXTRAS.get(name)
    what = f"{command} needs" if command else "this command needs"
    if name in MODULE_INSTALLS:
        return f"{what} the benchmarks ({name}), which are not installed: {MODULE_INSTALLS[name]}"
    return f"{what} {name}, which is not installed" + (f": pip install 'spillway[{extra}]'" if extra else "")


class OneLineUsage(click.ClickException):
    """A usage error of click's (an unknown flag, a missing argument, a bad ``--param``)
    said as spillway says its errors, in one line, where click printed the usage, a hint
    and the error on four; the exit status stays click's (2)."""

    def __init__(self, error: click.ClickException):
        message = error.format_message()
        ctx = getattr(error, "ctx", None)
        if ctx is not None:
            message += f" (see {ctx.command_path} -h)"
        super().__init__(message)
        self.exit_code = error.exit_code

    def show(self, file=None) -> None:
        click.echo(f"spillway: error: {self.format_message()}", err=True)


@contextlib.contextmanager
def usage_in_one_line():
    """Say click's usage errors in one line (:class:`OneLineUsage`); a group called with
    nothing still shows its help."""
    try:
        yield
    except (click.exceptions.NoArgsIsHelpError, OneLineUsage):
        raise
    except click.ClickException as e:
        raise OneLineUsage(e) from None
