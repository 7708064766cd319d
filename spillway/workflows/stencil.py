"""stencil: a Laplacian of radius ``depth`` on a 2-D or 3-D array, with halos.

``map_overlap`` gives every chunk a halo of ``depth`` cells from its neighbours (periodic
at the array's edges), so neighbouring chunks exchange thin slabs rather than whole
chunks. The kernel adds, along each axis and for each distance up to ``depth``, the two
neighbours, and subtracts ``2 * ndim * depth`` times the centre.

The reference applies the same kernel in NumPy float64 to the input padded periodically:
the whole array when small, else a slab that straddles the first chunk boundary.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from spillway.options.errors import ParamError

from . import inputs
from .backend import module_of
from .chunking import resolve_chunks
from .params import Param, Params, Target
from .workflow import Workflow
from .results import FULL_CHECK_BYTES, array_run, footprint, window

PARAMS = (
    Param("ndim", "choice", "Dimensions of the array", default=2, choices=(2, 3)),
    Param("depth", "int", "Stencil radius (halo width) in cells", default=1, minimum=1, maximum=64),
    *inputs.size_params("128MB", "16GB", what="Array"),
    inputs.input_param(),
)


def laplacian(block, depth: int):
    """The kernel on a block whose outer ``depth`` cells are halo (their output is junk)."""
    xp = module_of(block)
    out = block * (-2.0 * block.ndim * depth)
    for axis in range(block.ndim):
        for d in range(1, depth + 1):
            out += xp.roll(block, d, axis=axis) + xp.roll(block, -d, axis=axis)
    return out.astype(block.dtype, copy=False)


def _shape_chunks(params: Params, target: Target):
    shape, dtype = inputs.describe(params, ndim=params.ndim)
    chunks = resolve_chunks(params.chunks, shape, dtype, target)
    for n, c in zip(shape, chunks):
        if c < params.depth and c != n:
            raise ParamError(f"depth: {params.depth} is larger than a chunk of {c} cells "
                             f"(halos come from one neighbour); use larger chunks")
        if n < params.depth:
            raise ParamError(f"depth: {params.depth} is larger than the array's side of {n}")
    return shape, chunks


def check(params: Params, target: Target) -> None:
    _shape_chunks(params, target)


def build(params: Params, target: Target):
    from dask.array.utils import meta_from_array

    shape, chunks = _shape_chunks(params, target)
    source = inputs.open_source(params, target, chunks, ndim=params.ndim)
    depth = params.depth
    x = source.array
    y = x.map_overlap(partial(laplacian, depth=depth), depth=depth, boundary="periodic", dtype=x.dtype,
                      meta=meta_from_array(x))
    itemsize = y.dtype.itemsize
    if int(np.prod(shape)) * itemsize <= FULL_CHECK_BYTES:
        rows = slice(0, shape[0])
    else:
        boundary = chunks[0] if len(y.chunks[0]) > 1 else shape[0] // 2
        plane = int(np.prod(shape[1:])) * 8
        width = max(2, min(2 * depth + 8, FULL_CHECK_BYTES // plane))
        rows = window(shape[0], boundary, width)

    def reference():
        if rows.stop - rows.start == shape[0]:
            padded = np.pad(source.whole(), depth, mode="wrap")
        else:
            # the slab's rows with a halo of depth above and below (wrapping at the ends),
            # padded periodically along the other axes, which it spans whole
            index = np.arange(rows.start - depth, rows.stop + depth) % shape[0]
            rest = tuple(slice(0, n) for n in shape[1:])
            slab = np.concatenate([source.region((slice(i, i + 1), *rest)) for i in index])
            padded = np.pad(slab, [(0, 0)] + [(depth, depth)] * (len(shape) - 1), mode="wrap")
        inner = tuple(slice(depth, -depth) for _ in shape)
        return laplacian(padded, depth)[inner], \
            f"numpy float64 laplacian of x[{rows.start}:{rows.stop}] (periodic halo {depth})"

    # the submission was sized by the same function, from the parameters alone
    fp = project(params, target)
    return array_run(y, probe=y[rows], reference=reference, footprint=fp, source=source)


def project(params: Params, target: Target):
    """The footprint :func:`build` makes, from the parameters alone (no graph)."""
    shape, chunks = _shape_chunks(params, target)
    itemsize = np.dtype(inputs.describe(params, ndim=params.ndim)[1]).itemsize
    nbytes = int(np.prod(shape)) * itemsize
    halo_chunk = int(np.prod([c + 2 * params.depth for c in chunks])) * itemsize
    return footprint(nbytes, nbytes, halo_chunk, target.n_workers, temporaries=4)


WORKFLOW = Workflow(
    name="stencil",
    description="Periodic Laplacian of radius depth on a 2-D or 3-D seeded random array (map_overlap halos)",
    params=PARAMS,
    build=build,
    check=check,
    array_inputs=("x",),
    project=project,
)
