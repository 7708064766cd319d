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
from .registry import Workflow, register
from .results import REFERENCE_WHOLE_BYTES, footprint, scalar_run

PARAMS = (*inputs.size_params((4000, 4000), (50000, 50000)), inputs.input_param())


def chain(xp, x):
    """The elementwise chain, on dask arrays (``xp`` is dask.array) or NumPy arrays."""
    return xp.sqrt(xp.exp(-x) * xp.sin(3 * x) + x**2 + 1) / (1 + x)


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
            return chain(np, source.whole()).sum(), "numpy float64 chain(x).sum()"
        return (sum(s for _, _, s in source.panels(then=lambda p: chain(np, p).sum())),
                "numpy float64 chain(x).sum(), by row panels")

    x = source.array
    chunk_bytes = int(np.prod(x.chunksize)) * x.dtype.itemsize
    fp = footprint(source.nbytes, 0, chunk_bytes, target.n_workers, temporaries=4)
    return scalar_run(total, reference=reference, footprint=fp, dtype=source.dtype, source=source, name="sum",
                       extra={"shape": list(source.shape), "input_dtype": source.dtype})


WORKFLOW = register(Workflow(
    name="elementwise",
    description="(sqrt(exp(-x)*sin(3x) + x**2 + 1) / (1 + x)).sum(): an elementwise chain ending in a sum",
    params=PARAMS,
    build=build,
    check=check,
    array_inputs=("x",),
))
