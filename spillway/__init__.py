"""spillway: chunked array workflows larger than any one GPU, on Dask-CUDA.

``spillway.local(**options)`` starts the embedded cluster, ``spillway.slurm(...)`` a
cluster of Slurm jobs, ``spillway.connect(url, token)`` talks to the shared service; all
take the settings of :class:`spillway.Options`.
The packages: :mod:`spillway.service` (the cluster and the service),
:mod:`spillway.workflows` (named chunked-array workflows), :mod:`spillway.deploy`
(Slurm, MPI and systemd files, rendered by pure functions), :mod:`spillway.bench`
(benchmarks, run by the CLI only)."""

from spillway.cluster.errors import AdmissionError, OptionsError, ParamError, SpillwayError
from spillway.run.local import local
from spillway.run.slurm_cluster import slurm
from spillway.cluster.options import Options

__all__ = ["AdmissionError", "Options", "OptionsError", "ParamError", "SpillwayError", "connect", "local", "slurm"]


def __getattr__(name):
    # The service client loads on first use, so `import spillway` (every CLI command and
    # worker) pulls in no HTTP client.
    if name == "connect":
        try:
            from spillway.service.client import connect
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(f"spillway.connect needs {e.name}, which is not installed: "
                                      "pip install 'spillway[service]'", name=e.name) from None
        return connect
    raise AttributeError(f"module 'spillway' has no attribute {name!r}")
