"""The job database's own error: a database it cannot open, or a request it refuses."""

from spillway.options.errors import SpillwayError


class JobDBError(SpillwayError):
    exit_code = 2


class QuotaExceeded(JobDBError):
    """A submission past its tenant's queue quota (the API answers 429)."""
