"""spillway: chunked array workflows larger than any one GPU, on Dask-CUDA.

``spillway.local(**options)`` starts the embedded cluster, ``spillway.slurm(...)`` a
cluster of Slurm jobs, ``spillway.connect(url, token)`` talks to the shared service; all
take the settings of :class:`spillway.Options`.

The rooms, lowest first (``tests/test_layers.py`` holds the table and says why):
:mod:`spillway.upstream` (the seam: every hook into dependencies' private names),
:mod:`spillway.options` (the settings, sizes, GPUs and errors), :mod:`spillway.memory`
(the tiered store and admission), :mod:`spillway.datapath` (chunks between workers),
:mod:`spillway.launch` (every launcher of a cluster, one module each, what they render
and the plugins they register), :mod:`spillway.deploy` (the service's systemd files),
:mod:`spillway.workflows`
(named chunked-array workflows), :mod:`spillway.run` (a workflow run on a cluster),
:mod:`spillway.clusters` (the notebook clusters), :mod:`spillway.service` (the shared
service) and :mod:`spillway.cli`. The benchmarks are a distribution of their own
(``spillway_bench``, under ``benchmarks/``)."""

from spillway.options.errors import AdmissionError, OptionsError, ParamError, SpillwayError
from spillway.clusters.local import local
from spillway.clusters.slurm import slurm
from spillway.options.settings import Options

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
