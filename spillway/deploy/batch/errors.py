"""What a batch system's commands raise: one line each, for the CLI to print."""

from __future__ import annotations

from spillway.cluster.errors import SpillwayError


class BatchError(SpillwayError):
    """A batch system's command failed or is missing; the message carries its own one-line error."""

    exit_code = 1


class JobIdError(SpillwayError, ValueError):
    """A job id that the batch system could not have given; never handed to its commands."""

    exit_code = 2
