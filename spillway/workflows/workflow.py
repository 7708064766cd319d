"""What a workflow is: a :class:`Workflow` declares its parameters and a ``build`` function
that turns validated parameters into a lazy :class:`BuiltRun` (a dask collection, its
projected :class:`Footprint` and a reference check); building computes nothing. Also the
limits every graph is held to before it is built, and the relative error the reference
checks use. The catalogue of named workflows is :mod:`.registry`."""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from spillway.options.errors import ParamError

from .params import Param, Params, Target, shown


def key_text(key) -> str:
    """A parameter name as an error message shows it: as given when printable and short,
    else quoted with escapes (a tenant may send newlines, NUL or megabytes)."""
    text = str(key)
    return text if text.isprintable() and 0 < len(text) <= 64 and " " not in text else shown(key)

#: relative-error tolerances of the reference checks, by result dtype
TOLERANCE = {"float32": 1e-4, "float64": 1e-10}

#: most tasks a run's graph may have: a graph is built on the client (the API process for
#: the service) before anything runs, so a larger one is refused from its parameters alone
MAX_TASKS = 200_000
#: most bytes building a run's graph may take on the client (index arrays, the graph itself)
MAX_CLIENT_BYTES = 1 << 30
#: client bytes of one task of a built graph (its key, its spec, dask's bookkeeping)
BYTES_PER_TASK = 2048


@dataclass(frozen=True)
class GraphSize:
    """What building a run's graph costs the client, estimated from the parameters alone
    (shapes and chunk counts: arithmetic, no array and no graph)."""

    tasks: int
    client_bytes: int
    #: the parameter to change, and why the graph is this large
    param: str = "chunks"
    why: str = ""


def check_graph_size(name: str, size: GraphSize) -> None:
    """Refuse a graph past :data:`MAX_TASKS` or :data:`MAX_CLIENT_BYTES`, naming both numbers."""
    from spillway.options.sizes import format_bytes

    why = f" ({size.why})" if size.why else ""
    hint = "use fewer rows" if size.param == "count" else "use larger chunks or a smaller size"
    if size.tasks > MAX_TASKS:
        raise ParamError(f"{size.param}: {name} would build a graph of about {size.tasks:,} tasks{why}, "
                         f"more than the limit of {MAX_TASKS:,}; {hint}")
    if size.client_bytes > MAX_CLIENT_BYTES:
        raise ParamError(f"{size.param}: building the graph of {name} would take about "
                         f"{format_bytes(size.client_bytes)} on the client{why}, more than the limit of "
                         f"{format_bytes(MAX_CLIENT_BYTES)}")


def input_chunks(params: Params, target: Target) -> tuple[int, ...] | None:
    """Chunks per axis of the input ``x`` the parameters describe (None where they describe
    none); arithmetic on the shape and the chunks parameter only."""
    from .chunking import _resolve_chunks
    from .inputs import describe

    try:
        shape, dtype = describe(params, ndim=params.get("ndim", 2), columns=params.get("columns"))
        chunks = _resolve_chunks(params["chunks"], shape, dtype, target)
    except (ParamError, KeyError, AttributeError, TypeError, ValueError):
        return None
    return tuple(-(-n // max(1, c)) for n, c in zip(shape, chunks))


def graph_size(workflow: "Workflow", params: Params, target: Target) -> GraphSize | None:
    """The default estimate: a few tasks per input chunk (generate, compute, reduce)."""
    per_axis = input_chunks(params, target)
    if per_axis is None:
        return None
    n = math.prod(per_axis)
    tasks = 4 * n
    return GraphSize(tasks=tasks, client_bytes=tasks * BYTES_PER_TASK,
                     why=f"{n:,} input chunks ({'x'.join(map(str, per_axis))})")


@dataclass(frozen=True)
class Footprint:
    """Projected peak bytes of a run, before it starts."""

    total_bytes: int
    per_worker_bytes: int
    #: bytes of input data the run reads or generates
    input_bytes: int = 0

    def to_json(self) -> dict:
        return {
            "total_bytes": self.total_bytes,
            "per_worker_bytes": self.per_worker_bytes,
            "input_bytes": self.input_bytes,
        }


@dataclass
class BuiltRun:
    """A workflow run as ``Workflow.build`` makes it: lazy, nothing computed yet.

    (Not a plan: a :class:`spillway.launch.LaunchPlan` is how a cluster starts.)"""

    #: the dask collection (or collections) to compute
    result: Any
    footprint: Footprint
    #: turns the computed result into the JSON-able summary of the report
    summarize: Callable[[Any], dict]
    #: returns ``(reference, how)``: a NumPy float64 value or array and a short description;
    #: ``computed`` is the run's result, for checks that need it (QR, SVD)
    reference: Callable[[Any], tuple[Any, str]] | None = None
    tolerance: float = 1e-10
    #: the dask collection whose chunks the Zarr writer stores, when the result is an array
    array: Any = None
    notes: list[str] = field(default_factory=list)
    #: the part of the computed result that the reference describes (the whole by default)
    checked: Callable[[Any], Any] = lambda value: value
    #: bytes the run reads from storage (Zarr inputs)
    bytes_read: int = 0
    #: False when the graph carries per-chunk worker placement: dask's low-level task
    #: fusion rebuilds the graph without layer annotations, which would drop it
    optimize_graph: bool = True


def described_bytes(workflow: "Workflow", params: Params) -> int | None:
    """Bytes of the input ``x`` that the parameters describe, without building chunks: a
    generated input's ``size`` and ``dtype`` (the parameters of ``inputs.size_params``), a
    Zarr input's metadata, or an array handed over. None where they describe none (a
    workflow without those parameters, or values that do not parse: their own error says so).

    Every built-in workflow's run holds its input whole, so this is a floor under its footprint.
    """
    names = {p.name: p.kind for p in workflow.params}
    if names.get("size") != "size" or names.get("dtype") != "dtype":
        return None
    import numpy as np

    from .inputs import describe

    try:
        # the same shape the workflows build: ndim for stencil, columns for tsqr and svd
        shape, dtype = describe(params, ndim=params.get("ndim", 2), columns=params.get("columns"))
    except (ParamError, KeyError, AttributeError, TypeError, ValueError):
        return None
    return math.prod(shape) * np.dtype(dtype).itemsize


@dataclass(frozen=True)
class Workflow:
    name: str
    description: str
    params: tuple[Param, ...]
    build: Callable[[Params, Target], BuiltRun]
    #: cross-parameter checks (chunks larger than the array, ...) raising ParamError
    check: Callable[[Params, Target], None] | None = None
    #: names of the inputs a Python caller may hand over as arrays instead of generating them
    array_inputs: tuple[str, ...] = ()
    #: (workflow, params) -> bytes the parameters alone say the run holds, or None; a floor
    #: under the built run's footprint (see :func:`described_bytes`, the default)
    data_bytes: Callable[["Workflow", Params], int | None] = described_bytes
    #: (workflow, params, target) -> the :class:`GraphSize` the parameters describe, or None
    #: (see :func:`graph_size`, the default); past the limits, the run is refused before
    #: any graph is built
    graph: Callable[["Workflow", Params, Target], GraphSize | None] = graph_size
    #: (params, target) -> the built run's :class:`Footprint` without building its graph,
    #: where the workflow can say it from its parameters (the same arithmetic its build
    #: does); None: :meth:`projected` builds the graph. The service sizes a submission
    #: with it, so that a job's graph is built once, when it runs
    project: Callable[[Params, Target], Footprint] | None = None
    #: whether the built run's result is an array (:attr:`BuiltRun.array`) that an output
    #: store can take, known before the graph is built; False for a summary (a sum)
    array_result: bool = True

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def validate(
        self, raw: Mapping[str, Any] | None, target: Target | None = None, arrays: Mapping[str, Any] | None = None,
        *, fits: Callable[[Footprint], object] | None = None,
    ) -> Params:
        """Validated parameters, defaults for the target filled in.

        ``arrays`` maps input names (see ``array_inputs``) to arrays from Python that the
        workflow uses instead of generating its input.

        ``fits`` (where the cluster's capacity is known) is called with the footprint the
        parameters alone describe (:meth:`data_footprint`) before any other check, and
        raises AdmissionError: a run that cannot fit the cluster is refused for that, in
        bytes, whatever else is wrong with it (chunks it would need too many of, say).
        """
        target = target or Target()
        raw = dict(raw or {})
        arrays = dict(arrays or {})
        # the first error is raised once the footprint has been checked
        errors: list[ParamError] = []
        for key in arrays:
            if key not in self.array_inputs:
                accepted = ", ".join(self.array_inputs) or "none"
                errors.append(ParamError(f"{key_text(key)}: not an array input of {self.name} (array inputs: {accepted})"))
        unknown = self.first_unknown(raw)
        if unknown is not None:
            # the first only: a body of 60,000 unknown keys took seconds when each was spelled out
            errors.append(self.unknown_key(unknown))
        values = {}
        for p in self.params:
            value = raw[p.name] if p.name in raw else p.default_for(target)
            try:
                values[p.name] = p.parse(value)
            except ParamError as e:
                errors.append(e)
        params = Params(values, {k: v for k, v in arrays.items() if k in self.array_inputs})
        if fits is not None:
            footprint = self.data_footprint(params, target)
            if footprint is not None:
                fits(footprint)
        if errors:
            raise errors[0]
        if self.check is not None:
            self.check(params, target)
        size = self.graph(self, params, target)
        if size is not None:
            check_graph_size(self.name, size)
        return params

    def check_values(self, raw: Mapping[str, Any] | None) -> None:
        """Each value given, parsed alone (names and types, ranges, sizes): the checks that
        need no cluster, so a command line refuses a bad value before one starts."""
        unknown = self.first_unknown(raw)
        if unknown is not None:
            raise self.unknown_key(unknown)
        for key, value in dict(raw or {}).items():
            self.param(key).parse(value)

    def first_unknown(self, raw: Mapping[str, Any] | None):
        """The first key of ``raw`` that names none of the parameters, or None."""
        names = {p.name for p in self.params}
        return next((key for key in (raw or {}) if key not in names), None)

    def unknown_key(self, key) -> ParamError:
        """The error of a key that names no parameter, with the one it was likely meant to be
        (a key longer than any name is no typo of one, and is not compared)."""
        names = [p.name for p in self.params]
        longest = max((len(n) for n in names), default=0)
        hint = difflib.get_close_matches(key, names, n=1) if isinstance(key, str) and len(key) <= 2 * longest else []
        return ParamError(f"{key_text(key)}: not a parameter of {self.name}"
                          + (f" (did you mean {hint[0]}?)" if hint else f" (parameters: {', '.join(names)})"))

    def data_footprint(self, params: Params, target: Target | None = None) -> Footprint | None:
        """The footprint the parameters alone describe (the input held whole), computed
        without building chunks; None where they describe no input."""
        nbytes = self.data_bytes(self, params)
        if nbytes is None:
            return None
        n = max(1, (target or Target()).n_workers)
        return Footprint(total_bytes=nbytes, per_worker_bytes=-(-nbytes // n), input_bytes=nbytes)

    def build_run(
        self, raw: Mapping[str, Any] | None, target: Target | None = None, arrays: Mapping[str, Any] | None = None,
        *, fits: Callable[[Footprint], object] | None = None,
    ) -> tuple[Params, BuiltRun]:
        """Validate and build: a lazy :class:`BuiltRun`; nothing is computed. ``fits`` as in
        :meth:`validate`."""
        target = target or Target()
        params = self.validate(raw, target, arrays, fits=fits)
        return params, self.build(params, target)

    def projected(
        self, raw: Mapping[str, Any] | None, target: Target | None = None, arrays: Mapping[str, Any] | None = None,
        *, fits: Callable[[Footprint], object] | None = None,
    ) -> Footprint:
        """The projected footprint of the run the parameters describe (validated, ``fits``
        as in :meth:`validate`), from ``project`` where the workflow has one, else from
        the built run: a refusal before a cluster starts takes no longer than it must."""
        target = target or Target()
        params = self.validate(raw, target, arrays, fits=fits)
        if self.project is not None:
            return self.project(params, target)
        return self.build(params, target).footprint

    def schema(self, target: Target | None = None) -> dict:
        return {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": self.name,
            "description": self.description,
            "type": "object",
            "additionalProperties": False,
            "properties": {p.name: p.json_schema(target) for p in self.params},
        }

    def describe(self, target: Target | None = None) -> dict:
        return {"name": self.name, "description": self.description, "schema": self.schema(target)}


def relative_error(computed, reference) -> float:
    """‖computed − reference‖ / ‖reference‖ in float64 (NaN anywhere gives inf)."""
    import numpy as np

    from .backend import to_numpy

    c = np.asarray(to_numpy(computed), dtype=np.complex128 if np.iscomplexobj(reference) else np.float64)
    r = np.asarray(reference, dtype=c.dtype)
    if c.shape != r.shape:
        raise ValueError(f"result shape {c.shape} differs from the reference shape {r.shape}")
    if not np.all(np.isfinite(c)):
        return math.inf
    denom = float(np.linalg.norm(r.ravel()))
    num = float(np.linalg.norm((c - r).ravel()))
    return num / denom if denom else num
