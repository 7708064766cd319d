"""UCX environment variables of the processes of a spillway cluster.

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

#: UCX's global option: do not warn about UCX_ variables its parser did not use
QUIET_UCX = {"UCX_WARN_UNUSED_ENV_VARS": "n"}


def quiet_ucx(environ: MutableMapping[str, str] | None = None) -> None:
    """Set :data:`QUIET_UCX` in ``environ`` (this process's environment, which the
    workers it starts inherit) where the user has not set it."""
    environ = os.environ if environ is None else environ
    for key, value in QUIET_UCX.items():
        environ.setdefault(key, value)
