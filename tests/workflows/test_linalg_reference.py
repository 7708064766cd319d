"""The tall-skinny references: R from the Gram matrix where the input allows it, from the
QR of row panels where it does not, both NumPy float64."""

from __future__ import annotations

import numpy as np
import pytest

from spillway.workflows import linalg
from spillway.workflows.params import Target


class Panels:
    """A source of ``x`` read in row panels, too large to be taken whole."""

    def __init__(self, x):
        self.x = x
        self.shape = x.shape
        self.dtype = "float64"
        self.nbytes = linalg.REFERENCE_WHOLE_BYTES + 8  # past the whole-input path
        self.read = 0

    def panels(self, budget=128 * 2**20, then=None):
        for start in range(0, self.shape[0], 1000):
            self.read += 1
            block = self.x[start:start + 1000]
            yield start, start + 1000, block if then is None else then(block)


def _panel_qr(x):
    return np.linalg.qr(np.vstack([np.linalg.qr(x[i:i + 1000], mode="r") for i in range(0, len(x), 1000)]),
                        mode="r")


def test_gram_r_matches_the_panel_qr_of_a_random_input():
    x = np.random.default_rng(0).random((20000, 40))
    src = Panels(x)
    r = linalg.reference_r(src)
    expected = _panel_qr(x)
    np.testing.assert_allclose(np.abs(r), np.abs(expected), rtol=1e-11, atol=1e-9 * np.abs(expected).max())
    s = np.linalg.svd(r, compute_uv=False)
    s_ref = np.linalg.svd(x, compute_uv=False)
    assert np.max(np.abs(s - s_ref) / s_ref) < 1e-12
    assert src.read == 20  # one pass: the Gram matrix alone


def test_an_ill_conditioned_input_falls_back_to_the_panel_qr():
    rng = np.random.default_rng(1)
    u, _ = np.linalg.qr(rng.standard_normal((20000, 40)))
    x = u * np.logspace(0, -6, 40)  # condition number 1e6: the Gram matrix's is 1e12
    src = Panels(x)
    r = linalg.reference_r(src)
    assert src.read == 40  # the Gram pass, then the panel QR
    s = np.linalg.svd(r, compute_uv=False)
    s_ref = np.linalg.svd(x, compute_uv=False)
    assert np.max(np.abs(s - s_ref) / s_ref) < 1e-9


def test_the_svd_projects_q1_and_a_margin_and_tsqr_the_input_and_q():
    """dask's svd keeps only the first stage's Q whole (measured: 1.02-1.10x the input held);
    tsqr's reconstruction check reads the input and Q again, so both are held."""
    from spillway import workflows
    from spillway.workflows.linalg import SVD_MARGIN
    from spillway.workflows.params import Target

    target = Target(kind="gpu", n_workers=1, worker_bytes=100 * 2**30, chunk_backend="numpy")
    _, svd = workflows.get("svd").build_run({"size": "40000000x500"}, target)
    _, tsqr = workflows.get("tsqr").build_run({"size": "40000000x500"}, target)
    nbytes = 40_000_000 * 500 * 8
    assert svd.footprint.input_bytes == tsqr.footprint.input_bytes == nbytes
    assert (1 + SVD_MARGIN) * nbytes <= svd.footprint.total_bytes < 1.3 * nbytes
    assert 2 * nbytes <= tsqr.footprint.total_bytes < 2.1 * nbytes


def test_the_svd_of_a_callers_array_counts_that_array_held_beside_q1():
    import dask.array as da

    from spillway import workflows
    from spillway.workflows.linalg import SVD_MARGIN
    from spillway.workflows.params import Target

    target = Target(kind="cpu", n_workers=1, worker_bytes=2**30)
    x = da.zeros((400_000, 50), chunks=(50_000, 50))
    _, built = workflows.get("svd").build_run({"chunks": "50000x50"}, target, arrays={"x": x})
    _, generated = workflows.get("svd").build_run({"size": "400000x50", "chunks": "50000x50"}, target)
    assert built.footprint.total_bytes - generated.footprint.total_bytes == x.nbytes
    assert built.footprint.total_bytes >= (2 + SVD_MARGIN) * x.nbytes


@pytest.mark.parametrize("name", ["svd", "tsqr"])
@pytest.mark.parametrize("raw, target", [
    ({"size": "47500000x500"}, Target(kind="gpu", n_workers=1, worker_bytes=112 * 2**30, chunk_backend="numpy")),
    ({"size": "20GB", "columns": 64}, Target(kind="gpu", n_workers=2, worker_bytes=60 * 2**30, chunk_backend="numpy")),
    ({"size": "300000x40", "chunks": "25000x40", "dtype": "float32"}, Target(kind="cpu", n_workers=2)),
    ({"size": "100000x10"}, Target()),
])
def test_the_projection_is_the_built_runs_footprint(name, raw, target):
    from spillway import workflows

    workflow = workflows.get(name)
    assert workflow.project is not None
    _, built = workflow.build_run(raw, target)
    assert workflow.projected(raw, target) == built.footprint


@pytest.mark.parametrize("name", ["svd", "tsqr"])
def test_the_projection_of_a_callers_array_is_the_built_runs_footprint(name):
    import dask.array as da

    from spillway import workflows

    x = da.zeros((400_000, 50), chunks=(50_000, 50), dtype="float32")
    target = Target(kind="cpu", n_workers=1)
    _, built = workflows.get(name).build_run({"chunks": "50000x50"}, target, arrays={"x": x})
    assert workflows.get(name).projected({"chunks": "50000x50"}, target, arrays={"x": x}) == built.footprint
