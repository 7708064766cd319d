"""spillway's workflow library: named, parameterised chunked-array workflows."""

from .params import Param, Params, Target
from .registry import catalogue, get, names, register
from .workflow import BuiltRun, Footprint, Workflow

__all__ = ["BuiltRun", "Footprint", "Param", "Params", "Target", "Workflow", "catalogue", "get", "names", "register"]
