"""The workloads as data at the scales ``full``, ``small`` and ``tiny``: W1-W5, B1, B2
(:mod:`.standard`), O3-O5 (:mod:`.out_of_core`), B3-B5 (:mod:`.checked`). A workload runs
its registered workflow where that takes its parameters, else the expression of
:mod:`.expressions` (its ``source`` says which); its root layers are the seeded inputs the
harness persists before the clock.
"""

from __future__ import annotations

from spillway.options.errors import ParamError

from .checked import CHECKED
from .out_of_core import OUT_OF_CORE
from .standard import STANDARD
from .workload import SCALES, Built, Workload, data_bytes

__all__ = ["SCALES", "WORKLOADS", "Built", "Workload", "data_bytes", "select"]

#: every workload by name, in catalogue order: the in-memory rows, the out-of-core rows
#: of the default set, then the B rows
WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    *(w for w in STANDARD if w.name.startswith("W")), *OUT_OF_CORE,
    *(w for w in STANDARD if not w.name.startswith("W")), *CHECKED)}


def select(only: str | None) -> list[Workload]:
    """Workloads named in ``only`` ("W1,B2"), in catalogue order; None or "" for the
    default set (all but B3, B4 and B5)."""
    if not only:
        return [w for w in WORKLOADS.values() if w.default]
    names = [n.strip().upper() for n in only.split(",") if n.strip()]
    for n in names:
        if n not in WORKLOADS:
            raise ParamError(f"only: {n!r} is not a workload (known: {', '.join(WORKLOADS)})")
    return [w for w in WORKLOADS.values() if w.name in names]
