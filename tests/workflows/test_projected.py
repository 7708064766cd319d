"""Every built-in workflow says its footprint and whether its result is an array from its
parameters alone, and both agree with the run its build makes: the service sizes a
submission from them and builds the job's graph once, when it runs."""

from __future__ import annotations

import numpy as np
import pytest

from spillway import workflows
from spillway.workflows.params import Target

#: (workflow, params) beyond each workflow's defaults: explicit chunks, bytes per chunk,
#: uneven splits, other dtypes and the parameters a footprint depends on
CASES = [
    ("elementwise", {"size": "1000x700", "chunks": "300x250", "dtype": "float32"}),
    ("elementwise", {"size": "1000x700", "chunks": "100KB"}),
    ("reduction", {"size": "900x800", "chunks": "200x300", "op": "std", "axis": "1"}),
    ("transpose-sum", {"size": "900x900", "chunks": "250x250"}),
    ("fft", {"size": "1024x300", "chunks": "256x300", "dtype": "float32"}),
    ("fft", {"size": "1024x300", "chunks": "200KB"}),
    ("rechunk", {"size": "1000x600", "chunks": "128x600"}),
    ("stencil", {"size": "60x50x40", "ndim": 3, "chunks": "20x25x40", "depth": 2}),
    ("stencil", {"size": "500x400", "chunks": "128x128", "depth": 3}),
    ("slice", {"size": "1000x300", "chunks": "333x300", "step": 7}),
    ("gather", {"size": "1000x300", "chunks": "250x100", "count": 2345}),
    ("gather", {"size": "1000x300", "chunks": "250x100"}),
    ("matmul", {"size": "700x300", "chunks": "200x100"}),
    ("matmul", {"size": "300x700", "chunks": "250x250", "dtype": "float32"}),
    ("tsqr", {"size": "20000x16", "chunks": "3000x16"}),
    ("svd", {"size": "20000x16", "chunks": "3000x16"}),
]

TARGETS = [Target(kind="cpu", n_workers=3, worker_bytes=2**28, chunk_backend="numpy"),
           Target(kind="gpu", n_workers=2, worker_bytes=2**30, chunk_backend="numpy")]


def _params(name, extra, target):
    spec = workflows.get(name)
    known = {p.name for p in spec.params}
    return spec, spec.validate({k: v for k, v in extra.items() if k in known}, target)


@pytest.mark.parametrize("target", TARGETS, ids=["cpu", "gpu"])
@pytest.mark.parametrize("name", workflows.names())
def test_every_workflow_projects_its_defaults_as_built(name, target):
    spec, params = _params(name, {}, target)
    assert spec.project is not None, f"{name} has no footprint from its parameters: the service would build it twice"
    built = spec.build(params, target)
    assert spec.project(params, target) == built.footprint
    assert spec.array_result == (built.array is not None)


@pytest.mark.parametrize("target", TARGETS, ids=["cpu", "gpu"])
@pytest.mark.parametrize("name,extra", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_projected_footprint_is_the_built_one(name, extra, target):
    spec, params = _params(name, extra, target)
    assert spec.project(params, target) == spec.build(params, target).footprint


def test_projected_footprint_of_a_zarr_input_is_the_built_one(tmp_path):
    zarr = pytest.importorskip("zarr")
    path = str(tmp_path / "x.zarr")
    stored = zarr.open_array(path, mode="w", shape=(600, 500), chunks=(100, 500), dtype="float32")
    stored[:] = np.arange(600 * 500, dtype="float32").reshape(600, 500)
    target = TARGETS[0]
    for name in ("elementwise", "rechunk", "slice", "stencil"):
        spec, params = _params(name, {"input": path, "chunks": "150x250"}, target)
        assert spec.project(params, target) == spec.build(params, target).footprint, name
