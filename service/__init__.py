"""spillway's cluster and service: options, launchers, worker plugins and the CLI."""

from .errors import AdmissionError, OptionsError, ParamError, SpillwayError
from .options import Options

# Bound after the submodule of the same name is imported, so `service.local` is the
# function (the module stays importable as `from service.local import Local`).
from .local import local  # noqa: E402  isort: skip

__all__ = ["AdmissionError", "Options", "OptionsError", "ParamError", "SpillwayError", "connect", "local"]


def __getattr__(name):
    # The service client loads on first use, so `import service` (every CLI command and
    # worker) pulls in no HTTP client.
    if name == "connect":
        try:
            from .client import connect
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(f"service.connect needs {e.name}, which is not installed: "
                                      "pip install 'spillway[service]'", name=e.name) from None
        return connect
    raise AttributeError(f"module 'service' has no attribute {name!r}")
