"""The catalogue of named workflows: the built-in ones, listed here, and those other
packages add through the ``spillway.workflows`` entry-point group (each entry point names a
:class:`~.workflow.Workflow` object). The CLI, the HTTP service, notebooks and Slurm jobs
all go through :func:`get` / :func:`catalogue` here."""

from __future__ import annotations

import difflib
import threading
from importlib.metadata import entry_points

from spillway.options.errors import ParamError

from .params import Target
from .workflow import Workflow

ENTRY_POINT_GROUP = "spillway.workflows"


def builtin() -> tuple[Workflow, ...]:
    """The workflows spillway brings, in the catalogue's order of families. Their modules
    load on the first lookup, not with this one: a refusal from the parameters alone
    imports no array code."""
    from . import elementwise, fft, gather, linalg, rechunk, reductions, stencil, transpose_sum

    return (transpose_sum.WORKFLOW, linalg.MATMUL, rechunk.WORKFLOW, fft.WORKFLOW, linalg.TSQR, linalg.SVD,
            stencil.WORKFLOW, reductions.WORKFLOW, gather.SLICE, gather.GATHER, elementwise.WORKFLOW)


_REGISTRY: dict[str, Workflow] = {}
_LOADED = False
# the service resolves workflows from several job threads at once
_LOAD_LOCK = threading.Lock()


def register(workflow: Workflow) -> Workflow:
    if workflow.name in _REGISTRY and _REGISTRY[workflow.name] is not workflow:
        raise ValueError(f"workflow {workflow.name!r} is registered twice")
    _REGISTRY[workflow.name] = workflow
    return workflow


def _load():
    global _LOADED
    if _LOADED:
        return
    with _LOAD_LOCK:
        if _LOADED:
            return
        for workflow in builtin():
            register(workflow)
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            workflow = ep.load()
            if not isinstance(workflow, Workflow):
                raise TypeError(f"entry point {ep.name} ({ep.value}) is not a spillway Workflow")
            register(workflow)
        _LOADED = True


def names() -> list[str]:
    _load()
    return sorted(_REGISTRY)


def get(name: str) -> Workflow:
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        hint = difflib.get_close_matches(name, _REGISTRY, n=1)
        raise ParamError(
            f"workflow {name!r} is unknown"
            + (f" (did you mean {hint[0]}?)" if hint else f" (known: {', '.join(sorted(_REGISTRY))})")
        ) from None


def catalogue(target: Target | None = None) -> list[dict]:
    return [get(n).describe(target) for n in names()]
