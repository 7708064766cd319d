"""Imports the built-in workflow modules; each registers itself on import."""

from . import elementwise, fft, gather, linalg, rechunk, reductions, stencil, transpose_sum
