"""What a batch system's commands raise: one line each, for the CLI to print."""

from __future__ import annotations

from spillway.options.errors import SpillwayError


class BatchError(SpillwayError):
    """A batch system's command failed or is missing; the message carries its own one-line
    error. A command that is not there exits 2 (the machine is the user's to change: a
    login node has it), one that refused the job exits 1."""

    exit_code = 1

    def __init__(self, message: str, *, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class JobIdError(SpillwayError, ValueError):
    """A job id that the batch system could not have given; never handed to its commands."""

    exit_code = 2
