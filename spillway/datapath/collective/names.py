"""The names of a collective's keys, shared by the graph, its tasks and the scheduler's
plugin (no imports: the workflows build graphs without loading distributed)."""

from __future__ import annotations

CUT_PREFIX = "spillway-cut-"
BARRIER_PREFIX = "spillway-barrier-"
OUTPUT_PREFIX = "rechunk-exchange-"
PIECES_PREFIX = "spillway-pieces-"


def pieces_name(barrier_key) -> str:
    """The name of the pieces of the partial whose barrier is ``barrier_key``."""
    name, partial = barrier_key
    return f"{PIECES_PREFIX}{name.removeprefix(BARRIER_PREFIX)}-{partial}"


def is_barrier(key) -> bool:
    return type(key) is tuple and bool(key) and isinstance(key[0], str) and key[0].startswith(BARRIER_PREFIX)
