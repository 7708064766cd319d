"""Where a batch system's commands run: this machine's PATH, unless a test hands the
system a stand-in with the same two methods."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

COMMAND_TIMEOUT_S = 60


class Shell:
    """Finds and runs commands on this machine, each given ``timeout_s`` seconds."""

    def __init__(self, timeout_s: float = COMMAND_TIMEOUT_S):
        self.timeout_s = timeout_s

    def which(self, name: str) -> str | None:
        return shutil.which(name)

    def run(self, args: Sequence[str], *, input: str | None = None) -> subprocess.CompletedProcess:
        """Raises :class:`subprocess.TimeoutExpired` after ``timeout_s``."""
        return subprocess.run(list(args), input=input, capture_output=True, text=True, timeout=self.timeout_s)
