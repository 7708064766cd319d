"""The job scheduler of the shared service: which queued job runs next, and running it."""

from .order import next_job
from .scheduler import JobScheduler

__all__ = ["JobScheduler", "next_job"]
