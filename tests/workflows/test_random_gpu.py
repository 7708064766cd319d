"""Generated inputs on the GPU carry CuPy's type in their dask meta, so what dask builds
from the meta (map_overlap's constant boundary, full_like) is CuPy beside their chunks."""

from __future__ import annotations

import numpy as np
import pytest

from spillway_bench.matrix.user_code import laplacian_2d
from spillway.workflows import random

pytestmark = pytest.mark.gpu


def test_cupy_inputs_have_cupy_meta_and_map_overlap_with_a_constant_boundary_runs():
    import cupy

    x = random.uniform((300, 200), (100, 50), seed=3, backend="cupy")
    assert isinstance(x._meta, cupy.ndarray)
    y = x.map_overlap(laplacian_2d, depth=1, boundary=0).compute(scheduler="sync")
    assert isinstance(y, cupy.ndarray)
    host = random.uniform((300, 200), (300, 200), seed=3, backend="numpy").compute(scheduler="sync")
    expected = laplacian_2d(np.pad(host.astype(np.float64), 1))[1:-1, 1:-1]
    assert np.abs(cupy.asnumpy(y) - expected).max() / np.abs(expected).max() < 1e-12


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cupy_blocks_are_the_host_generators_bits(dtype):
    import cupy

    shape = (300_000, 500)
    for location in (((1_000, 1_400), (0, 500)), ((7, 411), (100, 433))):
        on_gpu = cupy.asnumpy(random.uniform_block(4, 1, shape, location, dtype, "cupy"))
        assert np.array_equal(on_gpu, random.uniform_block(4, 1, shape, location, dtype, "numpy"))


def test_a_gpu_graph_sized_on_numpy_metas_matches_the_cupy_one():
    import dataclasses

    from spillway import workflows
    from spillway.workflows.params import Target

    gpu = Target(kind="gpu", n_workers=1, worker_bytes=100 * 10**9)
    _, as_run = workflows.get("svd").build_run({"size": "20000000x500"}, gpu)
    _, sized = workflows.get("svd").build_run({"size": "20000000x500"}, dataclasses.replace(gpu, chunk_backend="numpy"))
    assert type(as_run.result[0]._meta).__module__.startswith("cupy")
    assert sized.footprint == as_run.footprint
    assert [r.chunks for r in sized.result] == [r.chunks for r in as_run.result]
