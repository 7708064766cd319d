"""spillway's cluster and service: options, launchers, worker plugins and the CLI."""

from .errors import AdmissionError, OptionsError, ParamError, SpillwayError
from .options import Options

__all__ = ["AdmissionError", "Options", "OptionsError", "ParamError", "SpillwayError"]
