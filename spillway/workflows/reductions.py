"""reduction: sum, mean, std or histogram of a seeded random array, over all elements or
one axis. The reduction trees move only partial results between workers.

The histogram bins a [low, high) range into equal bins per chunk on the workers (CuPy or
NumPy ``histogram``) and adds the counts. With the default 64 bins over [0, 1) every bin
edge is exact in float32 and float64, so the counts match the reference exactly.
"""

from __future__ import annotations

import numpy as np

from spillway.options.errors import ParamError

from . import inputs
from .chunking import resolve_chunks
from .params import Param, Params, Target
from .workflow import Workflow
from .results import REFERENCE_WHOLE_BYTES, footprint, scalar_run

OPS = ("sum", "mean", "std", "histogram")

PARAMS = (
    Param("op", "choice", "The reduction", default="sum", choices=OPS),
    Param("axis", "choice", "Reduce over all elements or along one axis (not for histogram)",
          default="all", choices=("all", "0", "1")),
    Param("bins", "int", "Histogram bins", default=64, minimum=1, maximum=2**20),
    Param("low", "float", "Histogram range start", default=0.0),
    Param("high", "float", "Histogram range end", default=1.0),
    *inputs.size_params((4000, 4000), (40000, 40000)),
    inputs.input_param(),
)


def _chunks(params: Params, target: Target):
    return lambda shape, dtype: resolve_chunks(params.chunks, shape, dtype, target)


def check(params: Params, target: Target) -> None:
    shape, dtype = inputs.describe(params)
    resolve_chunks(params.chunks, shape, dtype, target)
    if params.op == "histogram":
        if params.axis != "all":
            raise ParamError(f"axis: {params.axis} is not supported by histogram (only all)")
        if not params.low < params.high:
            raise ParamError(f"low: {params.low} must be below high ({params.high})")


def _hist_block(block, bins, low, high):
    from .backend import module_of

    xp = module_of(block)
    counts, _ = xp.histogram(block.ravel(), bins=bins, range=(low, high))
    return counts.astype(xp.int64).reshape((1,) * block.ndim + (bins,))


def histogram(x, bins: int, low: float, high: float):
    """Counts of ``x`` in ``bins`` equal bins over [low, high): per chunk, then summed."""
    import dask.array as da
    from dask.array.utils import meta_from_array

    per_block = da.map_blocks(
        _hist_block, x, bins, low, high,
        chunks=tuple((1,) * len(c) for c in x.chunks) + ((bins,),),
        new_axis=x.ndim, dtype=np.int64,
        meta=meta_from_array(x, dtype=np.int64).reshape((0,) * (x.ndim + 1)),
    )
    return per_block.sum(axis=tuple(range(x.ndim)))


def compute(x, params: Params):
    """The lazy reduction of ``x``, exactly the one named by ``op``."""
    axis = None if params.axis == "all" else int(params.axis)
    if params.op == "sum":
        return x.sum(axis=axis)
    if params.op == "mean":
        return x.mean(axis=axis)
    if params.op == "std":
        return x.std(axis=axis)
    return histogram(x, params.bins, params.low, params.high)


def reference(source, params: Params):
    """NumPy float64 of the same reduction, whole or one row panel at a time."""
    axis = None if params.axis == "all" else int(params.axis)
    if source.nbytes * 8 // np.dtype(source.dtype).itemsize <= REFERENCE_WHOLE_BYTES:
        a = source.whole()
        if params.op == "histogram":
            return np.histogram(a, bins=params.bins, range=(params.low, params.high))[0].astype(np.float64), \
                "numpy float64 histogram"
        return getattr(a, params.op)(axis=axis), f"numpy float64 {params.op}(axis={axis})"
    # panel by panel: sums (and sums of squared deviations for std) in float64
    n_total = np.prod(source.shape, dtype=np.float64)
    if params.op == "histogram":
        counts = np.zeros(params.bins, dtype=np.float64)
        for _, _, c in source.panels(then=lambda p: np.histogram(p, bins=params.bins, range=(params.low, params.high))[0]):
            counts += c
        return counts, "numpy float64 histogram, by row panels"
    parts = list(source.panels(then=lambda p: p.sum(axis=axis)))
    if axis == 1:
        sums = np.concatenate([s for _, _, s in parts])
        count = source.shape[1]
    else:
        sums = sum(s for _, _, s in parts)
        count = n_total if axis is None else source.shape[0]
    mean = sums / count
    if params.op == "sum":
        return sums, f"numpy float64 sum(axis={axis}), by row panels"
    if params.op == "mean":
        return mean, f"numpy float64 mean(axis={axis}), by row panels"
    sq = []
    for start, stop, p in source.panels():
        m = mean if axis != 1 else mean[start:stop, None]
        sq.append(((p - m) ** 2).sum(axis=axis))
    total = np.concatenate(sq) if axis == 1 else sum(sq)
    return np.sqrt(total / count), f"numpy float64 std(axis={axis}) in two passes, by row panels"


def build(params: Params, target: Target):
    source = inputs.open_source(params, target, _chunks(params, target))
    x = source.array
    result = compute(x, params)
    # the submission was sized by the same function, from the parameters alone
    fp = project(params, target)
    # "shape" is the result's (the bins of a histogram, the row sums of axis=1): the input's
    # has a name of its own
    return scalar_run(result, reference=lambda: reference(source, params), footprint=fp, source=source,
                       dtype=source.dtype, name=params.op,
                       extra={"input_shape": list(source.shape), "input_dtype": source.dtype})


def project(params: Params, target: Target):
    """The footprint :func:`build` makes, from the parameters alone (no graph)."""
    shape, dtype = inputs.describe(params)
    chunks = resolve_chunks(params.chunks, shape, dtype, target)
    itemsize = np.dtype(dtype).itemsize
    return footprint(int(np.prod(shape)) * itemsize, 0, int(np.prod(chunks)) * itemsize, target.n_workers,
                     temporaries=2)


WORKFLOW = Workflow(
    name="reduction",
    description="sum, mean, std or histogram of a seeded random array (all elements or one axis)",
    params=PARAMS,
    build=build,
    check=check,
    array_inputs=("x",),
    project=project,
    array_result=False,
)
