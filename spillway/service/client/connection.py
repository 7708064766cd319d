"""The connection to the service: :func:`connect` checks the tenant's token, and
:class:`ServiceClient` sends the requests (waiting out a database outage where a request
is safe to repeat) and turns the service's error answers into :class:`ServiceError`."""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Mapping
from typing import Any

import httpx

from spillway.options.errors import ServiceError
from .jobs import Job


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
    directory (``spillway serve --results-dir``), default ``SPILLWAY_RESULTS_DIR``: the
    service names outputs relative to it, and tells its own path to a client on its own
    machine only (which then needs neither). ``http`` replaces the HTTP client (its base URL
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
    if results_dir is None:
        results_dir = os.environ.get("SPILLWAY_RESULTS_DIR") or None
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
