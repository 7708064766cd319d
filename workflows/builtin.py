"""Imports the built-in workflow modules; each registers itself on import."""

from . import transpose_sum  # noqa: F401
