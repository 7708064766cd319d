"""rechunk: row panels to column panels, an all-to-all exchange.

Every output panel takes a piece of every input panel, so each worker sends to and
receives from every other: the workflow measures the fabric between workers. The
rechunk is spillway's collective (:mod:`spillway.datapath.collective`): each panel cut
once into the pieces the others need, the pieces taken in bulk, device to device, by the
worker that assembles each output panel; a task a panel, not one a piece.

The reference is the input itself, read back in NumPy float64: the rechunked array must
hold exactly the same values at the same positions.
"""

from __future__ import annotations

import numpy as np

from spillway.datapath.collective import rechunk

from . import inputs
from .chunking import panel_rows
from .params import Params, Target
from .workflow import BYTES_PER_TASK, GraphSize, Workflow
from .results import FULL_CHECK_BYTES, array_run, first_boundary, footprint, window

PARAMS = (
    *inputs.size_params((4000, 4000), (50000, 50000),
                        chunks_help="Panel thickness, rows per input panel and columns per output panel: "
                                    "a chunk shape whose first entry it is (1000x4000), bytes per panel or auto"),
    inputs.input_param(),
)


def _panels(params: Params, target: Target):
    shape, dtype = inputs.describe(params)
    rows = panel_rows(params.chunks, shape, dtype, target)
    cols = panel_rows(params.chunks, shape[::-1], dtype, target, name="chunks")
    return shape, (rows, shape[1]), (shape[0], cols)


def check(params: Params, target: Target) -> None:
    _panels(params, target)


def build(params: Params, target: Target):
    shape, row_panels, col_panels = _panels(params, target)
    source = inputs.open_source(params, target, row_panels)
    y = rechunk(source.array, col_panels)
    itemsize = y.dtype.itemsize
    if shape[0] * shape[1] * itemsize <= FULL_CHECK_BYTES:
        probe = (slice(0, shape[0]), slice(0, shape[1]))
    else:
        # rows around the first input panel boundary, columns around the first output one
        probe = (window(shape[0], first_boundary(source.array.chunks[0]), 256),
                 window(shape[1], first_boundary(y.chunks[1]), 4096))

    def reference():
        return source.region(probe), f"numpy float64 x[{probe[0].start}:{probe[0].stop}, " \
                                     f"{probe[1].start}:{probe[1].stop}] (values unchanged)"

    # the submission was sized by the same function, from the parameters alone
    fp = project(params, target)
    return array_run(y, probe=y[probe], reference=reference, footprint=fp, source=source)


def graph(workflow, params: Params, target: Target) -> GraphSize:
    """All-to-all: every row panel meets every column panel. The collective makes a task of
    each panel, in and out, but cuts and writes every piece on the workers, each for about
    what a task of dask's rechunk cost them: pieces are counted as tasks here, so that a
    rechunk of a million pieces is refused as dask's would be."""
    shape, (rows, _), (_, cols) = _panels(params, target)
    p, q = -(-shape[0] // rows), -(-shape[1] // cols)
    tasks = 4 * (p + q) + 2 * p * q
    return GraphSize(tasks=tasks, client_bytes=(4 * (p + q) + 1) * BYTES_PER_TASK,
                     why=f"{p:,} row panels to {q:,} column panels")


def project(params: Params, target: Target):
    """The footprint :func:`build` makes, from the parameters alone (no graph)."""
    shape, row_panels, _ = _panels(params, target)
    itemsize = np.dtype(inputs.describe(params)[1]).itemsize
    nbytes = shape[0] * shape[1] * itemsize
    return footprint(nbytes, nbytes, row_panels[0] * row_panels[1] * itemsize, target.n_workers, temporaries=3)


WORKFLOW = Workflow(
    name="rechunk",
    description="Rechunk a seeded random array from row panels to column panels (all-to-all)",
    params=PARAMS,
    build=build,
    check=check,
    array_inputs=("x",),
    graph=graph,
    project=project,
)
