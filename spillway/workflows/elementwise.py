"""elementwise: a chain of elementwise operations ending in a reduction,
``(sqrt(exp(-x) * sin(3x) + x**2 + 1) / (1 + x)).sum()``, computed as written.

dask fuses the chain into one task per chunk, so the workflow measures how fast the
workers stream through memory; only the partial sums move between them.
"""

from __future__ import annotations

import numpy as np

from . import inputs
from .chunking import resolve_chunks
from .params import Params, Target
from .workflow import Workflow
from .results import REFERENCE_WHOLE_BYTES, footprint, scalar_run

PARAMS = (*inputs.size_params((4000, 4000), (50000, 50000)), inputs.input_param())


def chain(xp, x):
    """The elementwise chain, on dask arrays (``xp`` is dask.array) or NumPy arrays."""
    return xp.sqrt(xp.exp(-x) * xp.sin(3 * x) + x**2 + 1) / (1 + x)


#: elements of one piece of :func:`chain_sum`: its two float64 buffers stay in cache
_PIECE = 1 << 15


def chain_sum(x: np.ndarray) -> float:
    """``chain(np, x).sum()`` in float64 on cache-sized pieces, in place: the expression
    makes six block-sized temporaries and runs at about a fifth of this rate, which made
    the reference of a 100 GB input take minutes longer than the run it checks."""
    flat = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    a = np.empty(min(_PIECE, flat.size))
    b = np.empty_like(a)
    total = 0.0
    for lo in range(0, flat.size, _PIECE):
        v = flat[lo:lo + _PIECE]
        p, q = a[: v.size], b[: v.size]
        np.negative(v, out=p)
        np.exp(p, out=p)
        np.multiply(v, 3.0, out=q)
        np.sin(q, out=q)
        p *= q
        np.multiply(v, v, out=q)
        p += q
        p += 1.0
        np.sqrt(p, out=p)
        np.add(v, 1.0, out=q)
        p /= q
        total += float(p.sum())
    return total


def check(params: Params, target: Target) -> None:
    shape, dtype = inputs.describe(params)
    resolve_chunks(params.chunks, shape, dtype, target)


def build(params: Params, target: Target):
    import dask.array as da

    source = inputs.open_source(params, target,
                                lambda shape, dtype: resolve_chunks(params.chunks, shape, dtype, target))
    total = chain(da, source.array).sum()

    def reference():
        if source.nbytes * 8 // np.dtype(source.dtype).itemsize <= REFERENCE_WHOLE_BYTES:
            return chain_sum(source.whole()), "numpy float64 chain(x).sum()"
        return (sum(s for _, _, s in source.panels(then=chain_sum)),
                "numpy float64 chain(x).sum(), by row panels")

    # the submission was sized by the same function, from the parameters alone
    fp = project(params, target)
    return scalar_run(total, reference=reference, footprint=fp, dtype=source.dtype, source=source, name="sum",
                       extra={"shape": list(source.shape), "input_dtype": source.dtype})


def project(params: Params, target: Target):
    """The footprint :func:`build` makes, from the parameters alone (no graph)."""
    shape, dtype = inputs.describe(params)
    chunks = resolve_chunks(params.chunks, shape, dtype, target)
    itemsize = np.dtype(dtype).itemsize
    return footprint(int(np.prod(shape)) * itemsize, 0, int(np.prod(chunks)) * itemsize, target.n_workers,
                     temporaries=4)


WORKFLOW = Workflow(
    name="elementwise",
    description="(sqrt(exp(-x)*sin(3x) + x**2 + 1) / (1 + x)).sum(): an elementwise chain ending in a sum",
    params=PARAMS,
    build=build,
    check=check,
    array_inputs=("x",),
    project=project,
    array_result=False,
)
