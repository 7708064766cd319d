"""The standard set, what a plain ``spillway bench`` runs on both clusters: W1 ... W5
(transpose-sum, matmul, rechunk, fft, 3-D stencil) and B1, B2 (transpose-sum beyond
device memory, and under a 12 GB device limit)."""

from __future__ import annotations

from .. import bounds
from . import expressions as ex
from .workload import Workload, same_shape, square, workflow_size

STANDARD = (
    Workload(
        name="W1", title="transpose-sum (x + x.T).sum()", workflow="transpose-sum",
        sizes={"full": square((40000, 40000), (10000, 10000)),
               "small": square((30000, 30000), (10000, 10000)),
               "tiny": square((2000, 2000), (500, 500))},
        direct=ex.transpose_sum, workflow_params=workflow_size, work=bounds.streamed(2),
    ),
    Workload(
        name="W2", title="matmul x.dot(y)", workflow="matmul",
        sizes={"full": same_shape(square((20000, 20000), (5000, 5000)), inputs=2),
               "small": same_shape(square((10000, 10000), (5000, 5000)), inputs=2),
               "tiny": same_shape(square((800, 800), (200, 200)), inputs=2)},
        direct=ex.matmul, workflow_params=workflow_size, work=bounds.matmul,
    ),
    Workload(
        name="W3", title="rechunk rows to columns", workflow="rechunk",
        sizes={"full": same_shape(square((80000, 80000), (1000, 80000)), to_chunks=(80000, 1000),
                                   out_chunks=(80000, 1000)),
               "small": same_shape(square((40000, 40000), (1000, 40000)), to_chunks=(40000, 1000),
                                    out_chunks=(40000, 1000)),
               "tiny": same_shape(square((2000, 2000), (50, 2000)), to_chunks=(2000, 50),
                                   out_chunks=(2000, 50))},
        direct=ex.rechunk_exchange,
        # plain dask-cuda rechunks with dask's task-based method (its P2P fails on CuPy
        # chunks); spillway's workflow is the collective
        baseline_direct=ex.rechunk,
        # the workflow's chunks are the panel thickness: rows in, columns out
        workflow_params=workflow_size, work=bounds.streamed(2),
    ),
    Workload(
        name="W4", title="fft along the chunked axis 0", workflow="fft",
        sizes={"full": same_shape({"shape": (40000, 40000), "chunks": (5000, 5000), "dtype": "complex128"},
                                   to_chunks=(40000, 1000)),
               "small": same_shape({"shape": (20000, 20000), "chunks": (5000, 5000), "dtype": "complex128"},
                                    to_chunks=(20000, 1000)),
               "tiny": same_shape({"shape": (1024, 1024), "chunks": (256, 256), "dtype": "complex128"},
                                   to_chunks=(1024, 64))},
        direct=ex.fft_exchange, baseline_direct=ex.fft, workflow_params=workflow_size, work=bounds.streamed(4),
    ),
    Workload(
        name="W5", title="3-D 7-point stencil", workflow="stencil",
        sizes={"full": same_shape({"shape": (2048,) * 3, "chunks": (512,) * 3, "dtype": "float32"}),
               "small": same_shape({"shape": (1024,) * 3, "chunks": (512,) * 3, "dtype": "float32"}),
               "tiny": same_shape({"shape": (64,) * 3, "chunks": (32,) * 3, "dtype": "float32"})},
        direct=ex.stencil,
        workflow_params=lambda p: {"ndim": 3, "depth": 1, "size": list(p["shape"]), "chunks": list(p["chunks"]),
                                   "dtype": p["dtype"]},
        work=bounds.streamed(2),
    ),
    Workload(
        name="B1", title="transpose-sum beyond device memory", workflow="transpose-sum",
        sizes={"full": square((160000, 160000), (10000, 10000)),
               "small": square((100000, 100000), (10000, 10000)),
               "tiny": square((3000, 3000), (500, 500))},
        direct=ex.transpose_sum, workflow_params=workflow_size,
    ),
    Workload(
        name="B2", title="transpose-sum, 12 GB device limit", workflow="transpose-sum",
        sizes={"full": square((80000, 80000), (10000, 10000)),
               "small": square((60000, 60000), (10000, 10000)),
               "tiny": square((2000, 2000), (500, 500))},
        direct=ex.transpose_sum, workflow_params=workflow_size,
        gpu_cluster={"device_memory_limit": "12GB"},
        speedup_target=5.0,
    ),
)
