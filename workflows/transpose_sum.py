"""transpose-sum: ``(x + x.T).sum()`` on a seeded random square array, computed as written.

Each output chunk needs the mirrored chunk of ``x``, so half the array crosses between
workers: the workflow measures all-to-all chunk transfer as much as arithmetic.
"""

from __future__ import annotations

import numpy as np

from service.errors import ParamError

from . import random
from .backend import backend_for, to_numpy
from .chunking import resolve_chunks, shape_from_size
from .params import Param, Params, Target
from .registry import TOLERANCE, Footprint, Plan, Workflow, register

#: largest input the NumPy float64 reference regenerates on the client
REFERENCE_LIMIT_BYTES = 2 * 2**30

PARAMS = (
    Param("size", "size", "Array side as a shape (40000x40000) or total bytes (200GB)",
          default=(4000, 4000), gpu_default=(40000, 40000)),
    Param("chunks", "chunks", "Chunk shape (10000x10000), bytes per chunk (800MB) or auto",
          default="auto"),
    Param("dtype", "dtype", "Element type", default="float64"),
    Param("seed", "int", "Seed of the random input", default=0, minimum=0, maximum=2**63 - 1),
)


def _shape_chunks(params: Params, target: Target):
    shape = shape_from_size(params.size, 2, params.dtype)
    if shape[0] != shape[1]:
        raise ParamError(f"size: {shape[0]}x{shape[1]} is not square; x + x.T needs a square array")
    chunks = resolve_chunks(params.chunks, shape, params.dtype, target)
    if chunks[0] != chunks[1]:
        raise ParamError(f"chunks: {chunks[0]}x{chunks[1]} must be square so x and x.T chunks align")
    return shape, chunks


def check(params: Params, target: Target) -> None:
    _shape_chunks(params, target)


def build(params: Params, target: Target) -> Plan:
    shape, chunks = _shape_chunks(params, target)
    x = random.uniform(shape, chunks, seed=params.seed, dtype=params.dtype, backend=backend_for(target.kind))
    total = (x + x.T).sum()

    itemsize = np.dtype(params.dtype).itemsize
    input_bytes = shape[0] * shape[1] * itemsize
    chunk_bytes = chunks[0] * chunks[1] * itemsize
    workers = max(1, target.n_workers)
    # the persisted input, plus per worker a received mirror chunk and the sum's temporary
    footprint = Footprint(
        total_bytes=input_bytes + 2 * chunk_bytes * workers,
        per_worker_bytes=-(-input_bytes // workers) + 2 * chunk_bytes,
        input_bytes=input_bytes,
    )

    def summarize(value) -> dict:
        return {"sum": float(to_numpy(value)), "shape": list(shape), "chunks": list(chunks),
                "dtype": params.dtype}

    def reference(_computed):
        if input_bytes <= REFERENCE_LIMIT_BYTES:
            a = random.uniform_numpy(shape, seed=params.seed, dtype=params.dtype).astype(np.float64)
            return np.float64((a + a.T).sum()), "numpy float64 (x + x.T).sum()"
        # Too large for the client: sum the same chunks in float64 on the CPU, one row
        # panel at a time. The identity sum(x + x.T) = 2 sum(x) is used only here, in
        # the check, never in the workflow.
        acc = np.float64(0)
        for start in range(0, shape[0], chunks[0]):
            stop = min(shape[0], start + chunks[0])
            block = random.uniform_block(params.seed, 0, shape, ((start, stop), (0, shape[1])),
                                         params.dtype, "numpy")
            acc += block.astype(np.float64).sum()
        return 2 * acc, "numpy float64 2*sum(x), by row panels"

    return Plan(result=total, footprint=footprint, summarize=summarize, reference=reference,
                tolerance=TOLERANCE[params.dtype])


WORKFLOW = register(Workflow(
    name="transpose-sum",
    description="(x + x.T).sum() of a seeded random square array; all-to-all chunk transfers",
    params=PARAMS,
    build=build,
    check=check,
))
