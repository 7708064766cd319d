"""slice and gather: ``x[::step]`` and fancy indexing ``x[index]`` along axis 0.

The slice keeps every ``step``-th row where it lies; the gather takes rows in a seeded
random order with repeats, so output chunks draw rows from chunks all over the cluster.
The reference reads the same rows of the input back in NumPy float64.
"""

from __future__ import annotations

import numpy as np

from . import inputs
from .chunking import resolve_chunks
from .params import Param, Params, Target
from .workflow import BYTES_PER_TASK, Footprint, GraphSize, Workflow, input_chunks
from .results import FULL_CHECK_BYTES, array_run, footprint

COMMON = (*inputs.size_params((4000, 4000), (50000, 50000)), inputs.input_param())

SLICE_PARAMS = (Param("step", "int", "Keep every step-th row (x[::step])", default=3, minimum=1,
                      maximum=2**31), *COMMON)
GATHER_PARAMS = (Param("count", "int", "Rows to gather; 0 gathers as many rows as x has", default=0, minimum=0,
                       maximum=2**27), *COMMON)

#: rows of the result the reference checks when the result is too large to check whole
PROBE_ROWS = 48


def _chunks(params: Params, target: Target):
    return lambda shape, dtype: resolve_chunks(params.chunks, shape, dtype, target)


def check(params: Params, target: Target) -> None:
    shape, dtype = inputs.describe(params)
    resolve_chunks(params.chunks, shape, dtype, target)


def gather_index(n_rows: int, count: int, seed: int) -> np.ndarray:
    """Row indices in a seeded random order, with repeats: the same for the same seed."""
    rng = np.random.default_rng([seed, 0x6A7E])
    return rng.integers(0, n_rows, size=count or n_rows, dtype=np.int64)


def _built_run(source, result, rows: np.ndarray, target: Target, what: str):
    """``rows[i]`` is the input row that result row ``i`` must equal."""
    n_out, n_cols = result.shape
    itemsize = result.dtype.itemsize
    if n_out * n_cols * itemsize <= FULL_CHECK_BYTES:
        picked = np.arange(n_out)
    else:  # the first and last rows and rows around each of the first output chunk boundaries
        edges = np.cumsum(result.chunks[0])[:4]
        picked = np.unique(np.concatenate([np.arange(8), n_out - 8 + np.arange(8),
                                           *(e + np.arange(-4, 4) for e in edges)]).clip(0, n_out - 1))
        picked = picked[:PROBE_ROWS * 2]

    def reference():
        cols = slice(0, n_cols)
        if len(picked) == n_out and source.nbytes <= 8 * FULL_CHECK_BYTES:
            return source.whole()[rows[picked]], f"numpy float64 {what}"
        return np.concatenate([source.region((slice(int(r), int(r) + 1), cols)) for r in rows[picked]]), \
            f"numpy float64 {what}, {len(picked)} rows"

    chunk_bytes = int(np.prod(source.array.chunksize)) * itemsize
    fp = footprint(source.nbytes, n_out * n_cols * itemsize, chunk_bytes, target.n_workers, temporaries=3)
    probe = result[picked] if len(picked) < n_out else result
    return array_run(result, probe=probe, reference=reference, footprint=fp, source=source)


def _project(params: Params, target: Target, out_rows) -> Footprint:
    """The footprint :func:`_built_run` makes, from the parameters alone (no graph):
    ``out_rows(n_rows)`` is the number of rows of the result."""
    shape, dtype = inputs.describe(params)
    chunks = resolve_chunks(params.chunks, shape, dtype, target)
    itemsize = np.dtype(dtype).itemsize
    return footprint(shape[0] * shape[1] * itemsize, out_rows(shape[0]) * shape[1] * itemsize,
                     chunks[0] * chunks[1] * itemsize, target.n_workers, temporaries=3)


def slice_project(params: Params, target: Target) -> Footprint:
    return _project(params, target, lambda n: len(range(0, n, params.step)))


def gather_project(params: Params, target: Target) -> Footprint:
    return _project(params, target, lambda n: params.count or n)


def slice_build(params: Params, target: Target):
    source = inputs.open_source(params, target, _chunks(params, target))
    result = source.array[:: params.step]
    rows = np.arange(0, source.shape[0], params.step)
    return _built_run(source, result, rows, target, f"x[::{params.step}]")


def gather_build(params: Params, target: Target):
    source = inputs.open_source(params, target, _chunks(params, target))
    index = gather_index(source.shape[0], params.count, params.seed)
    result = source.array[index]
    return _built_run(source, result, index, target, "x[index]")


SLICE = Workflow(
    name="slice",
    description="x[::step]: every step-th row of a seeded random array",
    params=SLICE_PARAMS,
    build=slice_build,
    check=check,
    array_inputs=("x",),
    project=slice_project,
)

def gather_graph(workflow, params: Params, target: Target) -> GraphSize | None:
    """x[index] from the parameters alone: ``count`` index rows held on the client (with
    dask's sorted copies of them) and about four tasks per output chunk, whose rows are
    cut at the input's row chunks."""
    per_axis = input_chunks(params, target)
    if per_axis is None:
        return None
    shape, _ = inputs.describe(params)
    out_rows = params.count or shape[0]
    rows_per_chunk = -(-shape[0] // per_axis[0])
    out_chunks = -(-out_rows // rows_per_chunk) * per_axis[1]
    tasks = 4 * (out_chunks + per_axis[0] * per_axis[1])
    return GraphSize(tasks=tasks, client_bytes=6 * 8 * out_rows + tasks * BYTES_PER_TASK, param="count",
                     why=f"{out_rows:,} rows gathered in {out_chunks:,} output chunks")


GATHER = Workflow(
    name="gather",
    description="x[index]: rows of a seeded random array in a seeded random order, with repeats",
    params=GATHER_PARAMS,
    build=gather_build,
    check=check,
    array_inputs=("x",),
    graph=gather_graph,
    project=gather_project,
)
