"""The job scheduler of the shared service: which queued job runs next, and running it."""

from .order import next_job
from .queue import JobQueue

__all__ = ["JobQueue", "next_job"]
