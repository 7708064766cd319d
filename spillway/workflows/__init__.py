"""spillway's workflow library: named, parameterised chunked-array workflows."""

from .params import Param, Params, Target
from .registry import Footprint, Plan, Workflow, catalogue, get, names, register

__all__ = ["Footprint", "Param", "Params", "Plan", "Target", "Workflow", "catalogue", "get", "names", "register"]
