"""What the store's tests read of a stack of tiers whatever lies below its host tier
(the stacks are tests/memory/conftest.py's)."""

from __future__ import annotations


def lowered(store) -> str:
    """The move from the host to the first tier below it (host_to_disk in the product)."""
    return f"host_to_{store.below[0].name}"


def raised(store) -> int:
    """Bytes read back into host buffers from every tier below the host."""
    return sum(store.stats.bytes[f"{t.name}_to_host"] for t in store.below)
