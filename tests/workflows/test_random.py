"""The host generator is the same hash as SplitMix64's whole-block expression, bit for
bit, at any block position: references regenerate inputs from it and compare exactly."""

from __future__ import annotations

import numpy as np
import pytest

from spillway.workflows import random


def _splitmix(z):
    """SplitMix64's finaliser as the expression of its definition, apart from the module's
    in-place code."""
    z = z + np.uint64(random._GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(random._M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(random._M2)
    return z ^ (z >> np.uint64(31))


def expression(seed, stream, shape, location, dtype):
    """The hash as one expression over the block."""
    with np.errstate(over="ignore"):
        z = _splitmix(random.linear_index(np, shape, location) ^ np.uint64(random._key(seed, stream)))
        if np.dtype(dtype) == np.float32:
            return (z >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)
        return ((z >> np.uint64(11)).astype(np.float64) * 2.0**-53).astype(dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("shape, location", [
    ((300_000, 500), ((1_000, 1_400), (0, 500))),           # whole rows: consecutive indices, past one piece
    ((300_000, 500), ((7, 411), (100, 433))),               # a column window: an index array
    ((40, 50, 60), ((3, 9), (0, 50), (0, 60))),             # 3-D, whole trailing planes
    ((40, 50, 60), ((3, 9), (5, 49), (1, 2))),              # 3-D, one column
    ((1_000_003,), ((999_000, 1_000_003),)),                # 1-D, a tail shorter than a piece
    ((10, 10), ((4, 4), (0, 10))),                          # empty
])
def test_host_generator_matches_the_expression_bit_for_bit(shape, location, dtype):
    got = random.uniform_block(11, 2, shape, location, dtype, "numpy")
    want = expression(11, 2, shape, location, dtype)
    assert got.dtype == np.dtype(dtype)
    assert got.shape == tuple(b - a for a, b in location)
    assert np.array_equal(got, want)


def test_a_block_is_the_same_values_as_the_whole_arrays_window():
    shape = (700, 300)
    whole = random.uniform_block(5, 0, shape, ((0, 700), (0, 300)), "float64", "numpy")
    part = random.uniform_block(5, 0, shape, ((123, 456), (77, 299)), "float64", "numpy")
    assert np.array_equal(part, whole[123:456, 77:299])
    assert 0.0 <= whole.min() and whole.max() < 1.0
    assert abs(whole.mean() - 0.5) < 0.01


def test_low_and_high_scale_the_same_draws():
    shape, location = (1000, 10), ((0, 1000), (0, 10))
    unit = random.uniform_block(1, 0, shape, location, "float64", "numpy")
    scaled = random.uniform_block(1, 0, shape, location, "float64", "numpy", low=-2.0, high=3.0)
    assert np.allclose(scaled, unit * 5.0 - 2.0, rtol=0, atol=1e-15)
