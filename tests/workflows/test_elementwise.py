"""The elementwise reference's in-place chain sums to the expression's value."""

from __future__ import annotations

import numpy as np
import pytest

from spillway.workflows.elementwise import chain, chain_sum


@pytest.mark.parametrize("shape, dtype", [((300, 700), np.float64), ((1, 5), np.float64), ((123, 457), np.float32)])
def test_chain_sum_is_the_expressions_sum(shape, dtype):
    x = np.random.default_rng(3).uniform(0, 1, shape).astype(dtype)
    want = chain(np, x.astype(np.float64)).sum()
    got = chain_sum(x)
    assert abs(got - want) / abs(want) < 1e-13


def test_chain_sum_reads_a_strided_view_as_its_values():
    x = np.random.default_rng(4).uniform(0, 1, (400, 400))
    view = x[::3, 5:300]
    assert abs(chain_sum(view) - chain(np, view).sum()) / chain(np, view).sum() < 1e-13
