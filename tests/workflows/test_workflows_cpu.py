"""Every workflow at a small size on a real two-worker CPU cluster, against its NumPy
float64 reference."""

from __future__ import annotations

import math

import pytest

from spillway import workflows
from spillway.run.compute import run_workflow

#: small parameters per case; each must still make several chunks
CASES = {
    "transpose-sum": {"size": "600x600", "chunks": "200x200"},
    "transpose-sum-float32": ("transpose-sum", {"size": "600x600", "chunks": "200x200", "dtype": "float32"}),
    "matmul": {"size": "300x200", "chunks": "100x80"},
    "matmul-float32": ("matmul", {"size": "300x300", "chunks": "100x100", "dtype": "float32"}),
    "rechunk": {"size": "500x400", "chunks": "100x400"},
    "fft": {"size": "512x96", "chunks": "128x32"},
    "fft-float32": ("fft", {"size": "512x96", "chunks": "128x32", "dtype": "float32"}),
    "tsqr": {"size": "4000x20", "chunks": "500x20"},
    "svd": {"size": "4000x20", "chunks": "500x20"},
    "stencil-2d": ("stencil", {"ndim": 2, "size": "300x200", "chunks": "100x50", "depth": 2}),
    "stencil-3d": ("stencil", {"ndim": 3, "size": "40x30x20", "chunks": "20x10x10", "depth": 1}),
    "sum": ("reduction", {"op": "sum", "size": "500x300", "chunks": "100x100"}),
    "mean-axis0": ("reduction", {"op": "mean", "axis": "0", "size": "500x300", "chunks": "100x100"}),
    "std-axis1": ("reduction", {"op": "std", "axis": "1", "size": "500x300", "chunks": "100x100"}),
    "std-float32": ("reduction", {"op": "std", "size": "500x300", "chunks": "100x100", "dtype": "float32"}),
    "histogram": ("reduction", {"op": "histogram", "size": "500x300", "chunks": "100x100"}),
    "slice": {"size": "500x300", "chunks": "100x100", "step": 3},
    "gather": {"size": "500x300", "chunks": "100x100", "count": 700},
    "elementwise": {"size": "500x300", "chunks": "100x100"},
    "elementwise-float32": ("elementwise", {"size": "500x300", "chunks": "100x100", "dtype": "float32"}),
}


def _case(case):
    spec = CASES[case]
    return spec if isinstance(spec, tuple) else (case, spec)


@pytest.mark.parametrize("case", sorted(CASES))
def test_workflow_matches_reference(cpu_session, case):
    name, params = _case(case)
    report = run_workflow(cpu_session, name, params, verify=True)
    v = report["verify"]
    assert v["ok"], f"{case}: relative error {v['rel_error']:.3e} > {v['tolerance']:.0e} ({v['reference']})"
    assert math.isfinite(v["rel_error"])
    assert report["tasks"] > 1
    assert report["workflow"] == name


def test_every_workflow_has_a_case():
    covered = {_case(c)[0] for c in CASES}
    assert set(workflows.names()) <= covered
