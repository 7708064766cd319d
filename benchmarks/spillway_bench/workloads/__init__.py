"""The benchmark workloads W1 ... W5, O3, O4 and B1 ... B5, at three scales.

A workload runs its registered workflow where one is registered and accepts the
workload's parameters; otherwise it builds the same dask expression here, and says so
(``source``), so the benchmark never silently measures something else. Either way the
result is a lazy collection whose root layers are the seeded random inputs: the harness
persists those before the clock starts.

Scales: ``full`` is the issue's definition (GPU host), ``small`` the same shapes scaled
down to minutes on two GPUs, ``tiny`` the CPU smoke run that CI executes.

O3 and O4 (:mod:`.out_of_core`, in the default set) are W3's rechunk and W4's FFT as a
user writes them, past the GPUs' memory at ``full`` (a footprint of 1.5x the GPUs' memory
with two or more, 2.5x on one), on three sides (spillway, spillway with dask's
task-based rechunk, the baseline), each on a fresh cluster whose first run is the
headline.

B3 (out of core: inputs at 1.5 times the GPUs' memory, persisted over device, pinned host
and disk) runs only when named (``--only B3``), on spillway's side only, with its own
memory options per scale, and its result is checked against a NumPy float64 reference.

B4 (``(x @ y).sum()`` of operands that hold 1.3x the GPUs' memory together) and B5 (an
all-to-all rechunk of an array of 1.3x the GPUs' memory, then ``.sum()``) are sized at
``full`` from the GPUs of the machine they run on (:meth:`.Workload.for_machine`, applied
when the bench is planned), so one command is out of core on one H100 or four H200s. They
run against the baseline and are checked against NumPy float64 too
(:mod:`spillway_bench.reference`: shortcuts that never form ``x @ y`` or the rechunked array). B5's
baseline is what a user writes for plain dask-cuda, ``x.rechunk(...)`` with dask's default
method (P2P at that size whenever a client is up), which is known to fail there; its
failure is recorded as the baseline's result, not as a failed bench.
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
