"""One workflow of a batch job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Run:
    """One workflow of the batch with its raw parameters (checked by the workflow)."""

    workflow: str
    params: Mapping[str, Any] = field(default_factory=dict)
    #: compare with the NumPy float64 reference (regenerated on the batch node's CPU)
    verify: bool = True
