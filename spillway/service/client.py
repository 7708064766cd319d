"""A Python client of the shared service, for notebooks and scripts.

``connect(url, token)`` talks to ``spillway serve`` over its HTTP API, with the tenant's
token, and nothing else: jobs are a registered workflow's name and parameters, exactly
what the API accepts. Errors the service answers with arrive as :class:`ServiceError`
carrying its message (and the HTTP status), so a notebook shows the service's own line.

Array results are written by the service as Zarr v3 stores in its results directory;
:meth:`JobResult.array` opens one lazily where this machine sees that directory (the
same machine, or a shared filesystem, mounted elsewhere with ``results_dir=``), with
CuPy chunks on a machine with a GPU.
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Mapping
from typing import Any

import httpx

from spillway.workflows.outputs import open_output

from .errors import ServiceError, SpillwayError

__all__ = ["Job", "JobFailed", "JobResult", "ServiceClient", "ServiceError", "connect", "open_output"]

#: job states after which nothing changes
FINAL_STATES = frozenset({"done", "failed", "cancelled"})


class JobFailed(SpillwayError):
    """A job ended failed or cancelled; the message is the job's error."""

    def __init__(self, message: str, *, job: Job):
        super().__init__(message)
        self.job = job


def _message(response: httpx.Response) -> str:
    """The service's message from an error response: FastAPI's ``detail`` string, or its
    list of field errors (``params.size: ...``) on one line."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, str):
        text = detail
    elif isinstance(detail, list) and detail:
        parts = []
        for e in detail:
            loc = [str(p) for p in e.get("loc", ()) if p != "body"]
            msg = str(e.get("msg", "")).removeprefix("Value error, ")
            parts.append(msg if not loc or msg.startswith(loc[-1] + ":") else f"{'.'.join(loc)}: {msg}")
        text = "; ".join(parts)
    else:
        text = response.text.strip() or f"HTTP {response.status_code} {response.reason_phrase}"
    return text


def connect(url: str, token: str, *, timeout: float = 30, verify: bool | str | ssl.SSLContext = True,
            results_dir: str | None = None, http: httpx.Client | None = None,
            outage_wait_s: float = 60) -> ServiceClient:
    """A client of the shared service at ``url`` acting as the tenant of ``token``.

    ``verify``: False, the path of a CA bundle (for a self-signed HTTPS certificate) or
    an ``ssl.SSLContext``. ``results_dir`` is where this machine sees the service's results
    directory, when not at the same path. ``http`` replaces the HTTP client (its base URL
    and headers are the caller's). ``outage_wait_s``: how long requests that are safe to
    repeat (reads, cancels, submissions with an idempotency key) wait out a service whose
    job database is unreachable (503 with Retry-After) before raising. Checks the token at
    once, so a wrong URL or token fails here rather than at the first job.
    """
    if not token:
        raise ServiceError("token: a tenant token is required (spillway tenant add NAME prints one)")
    if http is None:
        if isinstance(verify, (str, os.PathLike)):
            verify = ssl.create_default_context(cafile=os.fspath(verify))
        http = httpx.Client(base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {token}"},
                            timeout=timeout, verify=verify)
    client = ServiceClient(http, results_dir=results_dir, outage_wait_s=outage_wait_s)
    client.workflows()
    return client


def _repeatable(method: str, path: str, kw: dict) -> bool:
    """Whether sending the request again cannot do anything twice."""
    if method.upper() == "GET" or path.endswith("/cancel"):
        return True
    body = kw.get("json")
    return path.rstrip("/") == "/jobs" and isinstance(body, dict) and body.get("idempotency_key") is not None


class ServiceClient:
    """The tenant's view of the service: the catalogue, its jobs, submission."""

    def __init__(self, http: httpx.Client, *, results_dir: str | None = None, outage_wait_s: float = 60):
        self.http = http
        self.results_dir = results_dir
        self.outage_wait_s = outage_wait_s

    @property
    def url(self) -> str:
        return str(self.http.base_url)

    def request(self, method: str, path: str, **kw) -> Any:
        deadline = time.monotonic() + self.outage_wait_s
        while True:
            try:
                response = self.http.request(method, path, **kw)
            except httpx.HTTPError as e:
                raise ServiceError(f"cannot reach the service at {self.url}: {e}") from None
            left = deadline - time.monotonic()
            if response.status_code != 503 or left <= 0 or not _repeatable(method, path, kw):
                break
            try:
                wait = float(response.headers.get("retry-after", 1))
            except ValueError:
                wait = 1.0
            time.sleep(min(max(wait, 0.1), left))
        if response.is_error:
            raise ServiceError(_message(response), status=response.status_code)
        return response.json()

    def health(self) -> dict:
        """Liveness and the cluster: ``status`` (ok, degraded), ``down`` (what is:
        ``database``, ``cluster``), ``kind`` (gpu/cpu), ``workers``, ``queued``, ``running``.
        Answers at once, also while something is down (no waiting out the outage)."""
        try:
            response = self.http.get("/healthz")
        except httpx.HTTPError as e:
            raise ServiceError(f"cannot reach the service at {self.url}: {e}") from None
        if response.status_code in (200, 503):
            try:
                return response.json()
            except ValueError:
                pass
        raise ServiceError(_message(response), status=response.status_code)

    def workflows(self) -> list[dict]:
        """The catalogue: name, description and JSON schema (defaults for this cluster)."""
        return self.request("GET", "/workflows")

    def submit(self, workflow: str, params: Mapping[str, Any] | None = None, *, verify: bool = False,
               output: bool = False, priority: int = 0, idempotency_key: str | None = None,
               **more_params) -> Job:
        """Queue ``workflow`` with its parameters (a mapping, keywords, or both).

        ``output=True`` has the service write an array result as a Zarr store, read back
        with ``job.result().array``. Bad parameters are refused here with the service's
        message naming the parameter and the limit.
        """
        body = {"workflow": workflow, "params": {**(params or {}), **more_params}, "verify": verify,
                "output": output, "priority": priority}
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        return Job(self, self.request("POST", "/jobs", json=body))

    def job(self, job_id: str) -> Job:
        return Job(self, self.request("GET", f"/jobs/{job_id}"))

    def jobs(self, state: str | None = None, limit: int = 100) -> list[Job]:
        """This tenant's jobs, newest first."""
        params = {"limit": limit, **({"state": state} if state else {})}
        return [Job(self, j) for j in self.request("GET", "/jobs", params=params)["jobs"]]

    def close(self):
        self.http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<spillway service {self.url}>"


class Job:
    """A handle on one job. ``record`` is the last state the service reported."""

    def __init__(self, service: ServiceClient, record: dict):
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
        from .display import advance, progress_bar

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
        return JobResult(body, results_dir=self.service.results_dir, backend=backend)

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
        from .display import job_html

        return job_html(self.record)

    def __repr__(self):
        p = self.record["progress"]
        why = f" ({self.waiting})" if self.waiting else ""
        return (f"<spillway job {self.id} {self.record['workflow']} {self.state} "
                f"{p['tasks_done']}/{p['tasks_total']} tasks{why}>")


class JobResult:
    """A finished job's summary, run report and (lazily) its array output."""

    def __init__(self, body: dict, *, results_dir: str | None = None, backend: str = "auto"):
        from .display import Report

        self.id = body["id"]
        self.state = body["state"]
        self.summary: dict = body["summary"]
        self.report = Report(body["report"])
        #: the Zarr store's path on the service's machine (None without an array output)
        self.output: str | None = body.get("output")
        self.results_dir = results_dir
        self.backend = backend

    @property
    def path(self) -> str | None:
        """Where this machine reads the output: under ``results_dir`` when given."""
        if self.output is None or self.results_dir is None:
            return self.output
        return os.path.join(os.path.expanduser(self.results_dir), os.path.basename(self.output.rstrip("/")))

    @property
    def array(self):
        """The array result as a lazy dask array over the Zarr store (CuPy chunks on a
        machine with a GPU); None for workflows whose result is a summary."""
        if self.output is None:
            return None
        return open_output(self.path, backend=self.backend)

    def _repr_html_(self) -> str:
        return self.report._repr_html_()

    def __repr__(self):
        return f"<spillway result {self.id} {self.summary}>"
