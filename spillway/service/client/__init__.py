"""A Python client of the shared service, for notebooks and scripts.

``connect(url, token)`` talks to ``spillway serve`` over its HTTP API, with the tenant's
token, and nothing else: jobs are a registered workflow's name and parameters, exactly
what the API accepts. Errors the service answers with arrive as :class:`ServiceError`
carrying its message (and the HTTP status), so a notebook shows the service's own line.

Array results are written by the service as Zarr v3 stores in its results directory;
:meth:`JobResult.array` opens one lazily where this machine sees that directory (the
service's own machine, which the service tells where it is, or a shared filesystem,
mounted elsewhere with ``results_dir=``), with CuPy chunks on a machine with a GPU.

The package holds :mod:`.connection` (the HTTP client, on httpx, an extra), :mod:`.jobs`
(a job and its result) and :mod:`.job_html` (a job in a notebook).
"""

from spillway.workflows.outputs import open_output

from spillway.options.errors import ServiceError
from .connection import ServiceClient, connect
from .jobs import Job, JobFailed, JobResult

__all__ = ["Job", "JobFailed", "JobResult", "ServiceClient", "ServiceError", "connect", "open_output"]
