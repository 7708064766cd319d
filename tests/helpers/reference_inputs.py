"""The inputs spillway generates, built whole on the CPU: the NumPy reference side of a
check (the same values :func:`spillway.workflows.random.uniform` puts in its chunks)."""

from __future__ import annotations

from spillway.workflows.random import uniform_block


def uniform_numpy(shape, *, seed: int, stream: int = 0, dtype: str = "float64", low=0.0, high=1.0):
    """The whole array at once on the CPU: the reference side of a check."""
    location = tuple((0, s) for s in shape)
    return uniform_block(seed, stream, tuple(shape), location, dtype, "numpy", low, high)
