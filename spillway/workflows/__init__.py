"""spillway's workflow library: named, parameterised chunked-array workflows."""

from .params import Param, Params, Target
from .registry import BuiltRun, Footprint, Workflow, catalogue, get, names, register

__all__ = ["BuiltRun", "Footprint", "Param", "Params", "Target", "Workflow", "catalogue", "get", "names", "register"]
