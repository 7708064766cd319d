"""A job of the service seen from the client: its state, progress and logs, waiting with
a bar, cancelling, and its result (summary, run report and array output)."""

from __future__ import annotations

import os
import time
from typing import Any, Protocol

from spillway.workflows.outputs import open_output

from spillway.options.errors import ServiceError, SpillwayError


class Requests(Protocol):
    """What a job needs of its connection (:class:`.connection.ServiceClient`)."""

    results_dir: str | None

    def request(self, method: str, path: str, **kwargs: Any) -> Any: ...


#: job states after which nothing changes
FINAL_STATES = frozenset({"done", "failed", "cancelled"})


class JobFailed(SpillwayError):
    """A job ended failed or cancelled; the message is the job's error."""

    def __init__(self, message: str, *, job: Job):
        super().__init__(message)
        self.job = job


class Job:
    """A handle on one job. ``record`` is the last state the service reported."""

    def __init__(self, service: Requests, record: dict):
        self.service = service
        self.record = record

    @property
    def id(self) -> str:
        return self.record["id"]

    @property
    def state(self) -> str:
        """The state last fetched (``status()`` fetches it anew)."""
        return self.record["state"]

    def status(self) -> dict:
        """The job as the service sees it now: state, progress, timings, spilled bytes,
        error, and while it is queued why it waits (``waiting``)."""
        self.record = self.service.request("GET", f"/jobs/{self.id}")
        return self.record

    @property
    def waiting(self) -> str | None:
        """Why the job (when last fetched) is queued rather than running, such as
        ``waiting for memory: 1 running job holds 203.38 GiB ...``; None once it runs."""
        return self.record.get("waiting")

    def wait(self, timeout: float | None = None, *, progress=True, poll_s: float = 0.5) -> Job:
        """Block until the job ends, drawing its task progress; returns the job.

        ``progress``: True for a bar (a widget in Jupyter, text on stderr elsewhere), a
        text stream for a text bar on it, False for none. Raises :class:`JobFailed` with
        the job's error when it fails or is cancelled, TimeoutError after ``timeout`` s.
        Interrupting the wait leaves the job running on the service (``cancel()`` stops it).
        """
        from spillway.run.bars import advance, progress_bar

        deadline = None if timeout is None else time.monotonic() + timeout
        bar = progress_bar(self.record["workflow"], progress) if progress else None
        try:
            while True:
                record = self.status()
                if bar is not None:
                    advance(bar, record["progress"]["tasks_done"], record["progress"]["tasks_total"],
                            record["state"])
                if record["state"] in FINAL_STATES:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {self.id} is still {record['state']} after {timeout} s")
                time.sleep(poll_s)
        finally:
            if bar is not None:
                bar.close()
        self._raise_unless_done()
        return self

    def _raise_unless_done(self):
        if self.state == "failed":
            raise JobFailed(f"job {self.id} ({self.record['workflow']}) failed: {self.record['error']}", job=self)
        if self.state == "cancelled":
            raise JobFailed(f"job {self.id} ({self.record['workflow']}) was cancelled", job=self)

    def result(self, timeout: float | None = None, *, backend: str = "auto") -> JobResult:
        """The result once the job is done (waiting for it, without a bar): the summary,
        the run report and, for jobs submitted with ``output=True``, the array. Raises
        :class:`JobFailed` for a job that failed or was cancelled."""
        if self.state not in FINAL_STATES:
            self.wait(timeout, progress=False)
        self._raise_unless_done()
        body = self.service.request("GET", f"/jobs/{self.id}/result")
        # the directory the caller named wins; else the service's own, which it gives a
        # client on its machine only
        return JobResult(body, results_dir=self.service.results_dir or body.get("results_dir"), backend=backend)

    def cancel(self) -> dict:
        """Ask the service to cancel: a queued job at once, a running one once its tasks
        are stopped. Returns the job's state after the request."""
        self.record = self.service.request("POST", f"/jobs/{self.id}/cancel")
        return self.record

    def logs(self) -> list[str]:
        """What happened to the job, one ``time  line`` string per event."""
        lines = self.service.request("GET", f"/jobs/{self.id}/logs")["lines"]
        return [f"{entry['time'] or ''}  {entry['line']}".strip() for entry in lines]

    def _repr_html_(self) -> str:
        from .job_html import job_html

        return job_html(self.record)

    def __repr__(self):
        p = self.record["progress"]
        why = f" ({self.waiting})" if self.waiting else ""
        return (f"<spillway job {self.id} {self.record['workflow']} {self.state} "
                f"{p['tasks_done']}/{p['tasks_total']} tasks{why}>")


class JobResult:
    """A finished job's summary, run report and (lazily) its array output."""

    def __init__(self, body: dict, *, results_dir: str | None = None, backend: str = "auto"):
        from spillway.run.report import Report

        self.id = body["id"]
        self.state = body["state"]
        self.summary: dict = body["summary"]
        self.report = Report(body["report"])
        #: the Zarr store's path relative to the service's results directory (None without an
        #: array output); an older service gave its own absolute path
        self.output: str | None = body.get("output")
        self.results_dir = results_dir
        self.backend = backend

    @property
    def path(self) -> str | None:
        """Where this machine reads the output: under ``results_dir`` (``connect(results_dir=)``
        or ``SPILLWAY_RESULTS_DIR``), where this machine sees the service's results directory;
        on the service's own machine, under the directory the service gave."""
        if self.output is None:
            return None
        if self.results_dir is None:
            if os.path.isabs(self.output):
                return self.output
            raise ServiceError(f"output: the service names it relative to its results directory "
                               f"({self.output}), which it tells a client on its own machine only; here, pass "
                               "results_dir= to spillway.connect (or set SPILLWAY_RESULTS_DIR) where this machine "
                               "sees that directory")
        if os.path.isabs(self.output):  # an older service's own path: the store's name alone
            return os.path.join(os.path.expanduser(self.results_dir), os.path.basename(self.output.rstrip("/")))
        # the tenant's directory and the store, never a way out of results_dir
        parts = [p for p in self.output.split("/") if p not in ("", ".", "..")]
        return os.path.join(os.path.expanduser(self.results_dir), *parts)

    @property
    def array(self):
        """The array result as a lazy dask array over the Zarr store (CuPy chunks on a
        machine with a GPU); None for workflows whose result is a summary."""
        if self.output is None:
            return None
        path = self.path
        if not os.path.exists(os.path.join(path, "zarr.json")):
            tenant_dir = os.path.dirname(path)
            if os.path.isdir(tenant_dir) and not os.access(tenant_dir, os.R_OK | os.X_OK):
                raise ServiceError(f"output: {path!r} is not readable by this user (the service keeps each tenant's "
                                   "results its owner's alone): the owner gives you that directory (chown or an ACL)")
            raise ServiceError(f"output: no Zarr store at {path!r} on this machine; pass results_dir= where "
                               "the service's results directory is mounted here")
        return open_output(path, backend=self.backend)

    def _repr_html_(self) -> str:
        return self.report._repr_html_()

    def __repr__(self):
        return f"<spillway result {self.id} {self.summary}>"
