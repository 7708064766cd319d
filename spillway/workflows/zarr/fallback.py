"""When a chunk leaves the direct path: :class:`Fallback` says why, and zarr on the host
reads the chunk instead; :func:`note` logs each kind of reason once per worker process,
so a store of many chunks does not flood the worker's log."""

from __future__ import annotations

import logging

logger = logging.getLogger("spillway.workflows.zarr")

_noted: set[str] = set()


class Fallback(Exception):
    """This chunk cannot take the direct path; zarr on the host reads it instead."""


def note(kind: str, message: str) -> None:
    """Log a fallback once per worker process and kind of reason."""
    if kind not in _noted:
        _noted.add(kind)
        logger.warning("spillway zarr I/O: %s", message)
