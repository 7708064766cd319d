"""Imports the built-in workflow modules; each registers itself on import."""

from . import (  # noqa: F401
    elementwise,
    fft,
    gather,
    linalg,
    rechunk,
    reductions,
    stencil,
    transpose_sum,
)
