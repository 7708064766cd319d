"""Ctrl-C reaches the process that started a local cluster, not its worker processes.

A terminal sends Ctrl-C's SIGINT to its whole foreground process group: the worker
processes of ``spillway run``, ``up`` and ``serve`` each took it as a KeyboardInterrupt
and printed its traceback (41 to 72 lines) while their nannies, in the process that
started them, were already closing them. The workers are that process's to stop, in
order; they never act on SIGINT themselves.

The mask is the way in: a blocked signal stays blocked in the threads a thread starts and
in the processes they spawn (fork and exec keep the mask), and Python does not unblock it.
distributed spawns each worker from a thread of the cluster's event loop, which is made
while the cluster starts; SIGINT blocked in the starting thread then is blocked in every
worker of that cluster, those a nanny restarts later and those ``scale`` adds included.
"""

from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def held_from_workers():
    """SIGINT blocked in this (the main) thread while the cluster starts, so that the
    threads the start makes, and the worker processes they spawn, never take it; this
    thread takes it again after the start, a Ctrl-C pressed meanwhile included."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    from multiprocessing import resource_tracker

    # started before the mask: starting it unblocks SIGINT in the thread that starts it,
    # which would be the event loop's, just before it spawns the first worker
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
