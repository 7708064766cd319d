"""UCX settings of the processes of a spillway cluster: the workers' environment, and the
transports of the process that holds the client (:data:`CLIENT_UCX`).

spillway sets no ``UCX_MEMTYPE_CACHE`` itself: the ``ucxx`` package does, when it is
imported and the variable is unset (``UCX_MEMTYPE_CACHE=n``, which UCX before 1.18 needed
with CUDA memory). UCX 1.18 dropped the setting, so every process that starts UCX (the
client, the scheduler, each worker) printed ``UCX WARN unused environment variable:
UCX_MEMTYPE_CACHE`` to its stdout. Removing the variable does not help (ucxx sets it again
in each new process), so the processes are started with UCX's own switch for that warning
off. A value the user set is kept.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from .. import upstream

#: UCX's global option: do not warn about UCX_ variables its parser did not use
QUIET_UCX = {"UCX_WARN_UNUSED_ENV_VARS": "n"}


def quiet_ucx(environ: MutableMapping[str, str] | None = None) -> None:
    """Set :data:`QUIET_UCX` in ``environ`` (this process's environment, which the
    workers it starts inherit) where the user has not set it."""
    environ = os.environ if environ is None else environ
    for key, value in QUIET_UCX.items():
        environ.setdefault(key, value)


#: UCX settings of the process that holds the client and the local scheduler (a notebook's,
#: the bench's, ``spillway run``'s), not of the workers: no CUDA IPC. UCX 1.21 maps a peer's
#: GPU memory through CUDA IPC the first time it sees it and keeps that mapping until this
#: process exits, cache or no cache (its reachability check puts it in the cache for good;
#: openucx/ucx#11753), and a mapping holds the peer's whole allocation: an RMM pool. A
#: client that had received a CuPy value from each worker kept both workers' pools (123 GB
#: of each H200) alive after its cluster closed and its workers exited, and the next cluster
#: of the same process could not take its own (two H200s, 2026-11-28: "failed to allocate
#: 119.34 GiB", 0 of 2 workers started). Without CUDA IPC a value the client receives comes
#: through UCX's host staging (results are read once, rarely large); the workers, which move
#: the chunks, keep it.
CLIENT_UCX = {"tls": "^cuda_ipc"}


def start_client_ucx(*, gpu: bool) -> None:
    """Start UCX in this process with :data:`CLIENT_UCX`, before the local scheduler's
    listener or the client would start it with UCX's defaults (where UCX started here
    already, it stays as it is). ``gpu``: this machine has a GPU, whose CUDA context is made
    first, as distributed-ucxx makes it for a transport list that names CUDA (a list that
    only excludes one, as this does, it would not)."""
    settings: dict = {"environment": dict(CLIENT_UCX)}
    if gpu:
        settings["create-cuda-context"] = True
    upstream.start_ucx(settings)
