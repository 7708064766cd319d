"""Byte sizes: the one place where sizes are parsed and formatted.

Parsing and formatting are dask's (``dask.utils.parse_bytes`` / ``format_bytes``), so a
size reads the same in spillway, dask and dask-cuda settings.
"""

from __future__ import annotations

import math

from dask.utils import format_bytes, parse_bytes

__all__ = ["MAX_BYTES", "SizeOverflow", "format_bytes", "parse_size", "parse_size_or_fraction"]

#: the largest size spillway takes (1 EiB): past it a size is a typo, and sizes well past it
#: (``1e400GB``) overflow the integer conversion of dask's parser
MAX_BYTES = 2**60


class SizeOverflow(ValueError, OverflowError):
    """A size past :data:`MAX_BYTES`: a ``ValueError`` (one line naming the value and the
    limit, like any bad size) that callers may still tell apart as an ``OverflowError``."""


def parse_size(value, *, name: str, minimum: int = 0) -> int:
    """Bytes from an int or a string such as ``"20GB"``; ``ValueError`` names ``name``
    (:class:`SizeOverflow` for a size past :data:`MAX_BYTES`, ``1e400GB`` included)."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a size such as 20GB, got {value!r}")
    given = value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        nbytes = value
    elif isinstance(value, str):
        try:
            nbytes = parse_bytes(value.strip())
        except OverflowError:
            raise _too_large(name, value) from None
        except (ValueError, TypeError):
            raise ValueError(
                f"{name}: cannot parse {value!r} as a size (use bytes such as 20GB or 512MiB)"
            ) from None
    else:
        raise ValueError(f"{name}: expected a size such as 20GB, got {value!r}")
    if nbytes > MAX_BYTES:
        raise _too_large(name, given)
    if nbytes < minimum:
        raise ValueError(f"{name}: {value!r} is below the minimum of {format_bytes(minimum)}")
    return nbytes


def _too_large(name: str, value) -> SizeOverflow:
    return SizeOverflow(f"{name}: {value!r} exceeds the largest supported size {format_bytes(MAX_BYTES)}")


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
