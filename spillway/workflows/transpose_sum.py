"""transpose-sum: ``(x + x.T).sum()`` on a square array, computed as written.

Each output chunk needs the mirrored chunk of ``x``, so half the array crosses between
workers: the workflow measures all-to-all chunk transfer as much as arithmetic.
"""

from __future__ import annotations

import numpy as np

from spillway.options.errors import ParamError

from . import inputs
from .chunking import resolve_chunks
from .params import Params, Target
from .workflow import Workflow
from .results import REFERENCE_WHOLE_BYTES, footprint, scalar_run

#: largest input the NumPy float64 reference regenerates whole on the client
REFERENCE_LIMIT_BYTES = 2 * 2**30

PARAMS = (*inputs.size_params((4000, 4000), (40000, 40000), what="Array side"), inputs.input_param())


def _shape_chunks(params: Params, target: Target):
    shape, dtype = inputs.describe(params)
    if shape[0] != shape[1]:
        raise ParamError(f"size: {shape[0]}x{shape[1]} is not square; x + x.T needs a square array")
    chunks = resolve_chunks(params.chunks, shape, dtype, target)
    if chunks[0] != chunks[1]:
        raise ParamError(f"chunks: {chunks[0]}x{chunks[1]} must be square so x and x.T chunks align")
    return shape, chunks


def check(params: Params, target: Target) -> None:
    _shape_chunks(params, target)


def build(params: Params, target: Target):
    shape, chunks = _shape_chunks(params, target)
    source = inputs.open_source(params, target, chunks)
    x = source.array
    total = (x + x.T).sum()

    def reference():
        if source.nbytes * 8 // np.dtype(source.dtype).itemsize <= max(REFERENCE_WHOLE_BYTES, REFERENCE_LIMIT_BYTES):
            a = source.whole()
            return np.float64((a + a.T).sum()), "numpy float64 (x + x.T).sum()"
        # Too large for the client: sum the input in float64 one row panel at a time. The
        # identity sum(x + x.T) = 2 sum(x) is used only here, in the check, never in the workflow.
        return 2 * sum(s for _, _, s in source.panels(then=np.sum)), "numpy float64 2*sum(x), by row panels"

    # the submission was sized by the same function, from the parameters alone
    fp = project(params, target)
    return scalar_run(total, reference=reference, footprint=fp, dtype=source.dtype, source=source, name="sum",
                       extra={"shape": list(shape), "chunks": list(chunks), "dtype": source.dtype})


def project(params: Params, target: Target):
    """The footprint :func:`build` makes, from the parameters alone (no graph)."""
    shape, chunks = _shape_chunks(params, target)
    itemsize = np.dtype(inputs.describe(params)[1]).itemsize
    # the input, plus per worker a received mirror chunk and the sum's temporary
    return footprint(shape[0] * shape[1] * itemsize, 0, chunks[0] * chunks[1] * itemsize, target.n_workers,
                     temporaries=2)


WORKFLOW = Workflow(
    name="transpose-sum",
    description="(x + x.T).sum() of a seeded random square array; all-to-all chunk transfers",
    params=PARAMS,
    build=build,
    check=check,
    array_inputs=("x",),
    project=project,
    array_result=False,
)
