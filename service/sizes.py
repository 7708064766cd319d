"""Byte sizes: the one place where sizes are parsed and formatted.

Parsing and formatting are dask's (``dask.utils.parse_bytes`` / ``format_bytes``), so a
size reads the same in spillway, dask and dask-cuda settings.
"""

from __future__ import annotations

import math

from dask.utils import format_bytes, parse_bytes

__all__ = ["format_bytes", "parse_size", "parse_size_or_fraction"]


def parse_size(value, *, name: str, minimum: int = 0) -> int:
    """Bytes from an int or a string such as ``"20GB"``; ``ValueError`` names ``name``."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a size such as 20GB, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        nbytes = value
    elif isinstance(value, str):
        try:
            nbytes = parse_bytes(value.strip())
        except (ValueError, TypeError):
            raise ValueError(
                f"{name}: cannot parse {value!r} as a size (use bytes such as 20GB or 512MiB)"
            ) from None
    else:
        raise ValueError(f"{name}: expected a size such as 20GB, got {value!r}")
    if nbytes < minimum:
        raise ValueError(f"{name}: {value!r} is below the minimum of {format_bytes(minimum)}")
    return nbytes


def parse_size_or_fraction(value, *, name: str) -> int | float:
    """Bytes (int) or a fraction of a device or host (float in (0, 1])."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text)
        except ValueError:
            return parse_size(text, name=name, minimum=1)
    if isinstance(value, float):
        if math.isfinite(value) and 0 < value <= 1:
            return value
        if not (math.isfinite(value) and value.is_integer() and value > 1):
            raise ValueError(
                f"{name}: {value!r} is neither a fraction in (0, 1] nor a whole number of bytes"
            )
    return parse_size(value, name=name, minimum=1)
