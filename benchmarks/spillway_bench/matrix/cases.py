"""The matrix's cases: every catalogue workflow on the ``cli`` and ``notebook`` paths,
rechunk, matmul and svd through the shared service and the batch script, the user-code
cases, and the workflow parameters that size a case to its scale."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .scale import SEED, Scale, grow

PATHS = ("cli", "service", "batch", "notebook", "user-code")
#: paths whose cases start a cluster of their own (run before a slice's local cluster)
OWN_CLUSTER = ("cli", "service", "batch")
#: the workflows the shared service and the batch script run (:mod:`.entry`)
ENTRY_WORKFLOWS = ("rechunk", "matmul", "svd")
#: the user-code cases, in the table's order (:data:`.user_code.USER_CODE` builds them)
USER_CODE_NAMES = ("qr", "svd", "lstsq", "matmul", "map_overlap", "reductions", "rechunk")


@dataclass(frozen=True)
class Case:
    workflow: str
    path: str
    #: workflow parameters other than size and seed
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.path}-{self.workflow}"


def catalogue() -> list[str]:
    from spillway import workflows
    return workflows.names()


def cases() -> list[Case]:
    """Every catalogue workflow on the cli path, :data:`ENTRY_WORKFLOWS` on the service and
    batch paths, every catalogue workflow on the notebook path, then the user-code cases.
    The cases that start a cluster of their own (:data:`OWN_CLUSTER`) come first: their
    clusters must not share the GPUs with the notebook's."""
    names = catalogue()
    return ([Case(n, "cli") for n in names]
            + [Case(n, path) for path in ("service", "batch") for n in ENTRY_WORKFLOWS]
            + [Case(n, "notebook") for n in names] + [Case(n, "user-code") for n in USER_CODE_NAMES])


def case_by_id(case_id: str) -> Case:
    for c in cases():
        if c.id == case_id:
            return c
    raise KeyError(case_id)


# --- sizing


def workflow_params(case: Case, scale: Scale, seed: int = SEED, target=None) -> tuple[dict, int]:
    """Raw parameters of a workflow case: ``size`` in bytes so that the projected
    footprint is at least the scale's target, on ``target`` (a running cluster's; else the
    scale's, which is what ``spillway run`` sees on the GPU host: auto chunks follow it);
    and that projected footprint."""
    from spillway import workflows
    workflow = workflows.get(case.workflow)
    target = target or scale.target()

    def footprint_of(size: int) -> int:
        raw = {**case.params, "size": f"{size}B", "seed": seed}
        return workflow.build_run(raw, target)[1].footprint.total_bytes

    size = grow(footprint_of, scale.target_bytes, scale.target_bytes // 2)
    return {**case.params, "size": f"{size}B", "seed": seed}, footprint_of(size)


def seeded_inputs(built) -> dict[str, tuple]:
    """``{input name: (shape, chunks, dtype, stream)}`` of a built run's seeded inputs, read from
    the root layers of its graph (the generator's tasks name shape, location and stream),
    so a user can generate and persist exactly the arrays the workflow would have."""
    from dask.highlevelgraph import HighLevelGraph

    from spillway.workflows import random

    collections = built.result if isinstance(built.result, tuple) else (built.result,)
    found: dict[int, tuple] = {}
    for c in collections:
        graph = c.__dask_graph__()
        if not isinstance(graph, HighLevelGraph):
            continue
        for name, deps in graph.dependencies.items():
            if deps or not name.startswith("uniform-"):
                continue
            tasks = [t for t in graph.layers[name].values() if isinstance(t, tuple) and t[0] is random.uniform_block]
            if not tasks:
                continue
            _, _, stream, shape, _, dtype, *_ = tasks[0]
            bounds = [sorted({t[4][d] for t in tasks}) for d in range(len(shape))]
            chunks = tuple(tuple(b - a for a, b in axis) for axis in bounds)
            found[stream] = (tuple(shape), chunks, dtype, stream)
    names = {0: "x", 1: "y"}
    return {names[s]: v for s, v in sorted(found.items())}


