"""Ctrl-C and a batch system's SIGTERM on the command line: the command stops what it
started (the run's tasks, the cluster's processes, a partial output) and says what in one
line, exit 130 (Ctrl-C) or 143 (SIGTERM; 0 for ``up`` and ``serve``, whose ordinary stop it
is).

Before, click said "Aborted!" (exit 1) below the workers' tracebacks, and SIGTERM killed
``spillway run`` where it stood, its cluster with it. SIGTERM is raised here as Ctrl-C's
KeyboardInterrupt is (:class:`Terminated`), so that one path of clean-ups serves both.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading

import click


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be."""

    exit_code = 128 + signal.SIGTERM


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM raises :class:`Terminated` in the main thread meanwhile."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, frame):
        from spillway.launch import quiet_logs

        # a batch system or a service manager signals every process of the job: the workers
        # die of it at once, and their nannies would say so while this process stops the
        # cluster; what stops is said in the command's one line. Never left: the process
        # is ending
        quiet_logs().__enter__()
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Stopping:
    """What an interrupt stops now: ``what`` follows the command as it starts more."""

    def __init__(self, what: str):
        self.what = what


@contextlib.contextmanager
def stopping(what: str, *, sigterm_exit: int | None = None):
    """Name what an interrupt inside stops (the innermost name is said); ``sigterm_exit``:
    the exit status of a SIGTERM here, where it is the command's ordinary stop."""
    stop = Stopping(what)
    try:
        yield stop
    except KeyboardInterrupt as e:
        if not hasattr(e, "stopped"):
            e.stopped = stop.what
        if sigterm_exit is not None and isinstance(e, Terminated):
            e.exit_code = sigterm_exit
        raise


def stopped_as(what: str):
    """A command whose interrupt stops ``what`` (:func:`stopping` around all of it)."""

    def decorate(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with stopping(what):
                return func(*args, **kwargs)

        return wrapper

    return decorate


def say_stopped(e: KeyboardInterrupt) -> int:
    """Say in one line what the interrupt stopped; its exit status."""
    how = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
    click.echo(f"spillway: {how}: stopped {getattr(e, 'stopped', None) or 'the command'}", err=True)
    return getattr(e, "exit_code", 128 + signal.SIGINT)
