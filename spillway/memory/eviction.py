"""The order values leave a tier in, and how much must leave.

Eviction is by next use: a ``rank`` callable (see :mod:`spillway.memory.policy`)
says when each key is needed next by the tasks queued on the worker; groups whose keys
nobody here waits for go first, then those needed last. Keys that running tasks read
(``in_use``) never leave the device: moving them would free nothing.

Functions of the state they are given: the caller holds the store's lock (see
:class:`spillway.memory.store.TieredStore`), none of them locks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from typing import Any

from .accounting import DeviceTier


def running(in_use: Callable[[], Collection] | None) -> set:
    """The keys running tasks read now (none when the store is not told)."""
    if in_use is None:
        return set()
    for _ in range(3):
        try:
            return set(in_use())
        except RuntimeError:  # the worker's event loop changed its tasks while we read
            continue
    return set()


def rank_of(rank: Callable[[Hashable], Any] | None, keys) -> Any:
    """When the soonest of ``keys`` is needed here (None: by no task here)."""
    if rank is None:
        return None
    ranks = [r for r in map(rank, keys) if r is not None]
    return min(ranks) if ranks else None


def ordered(groups: list, rank, keys_of=lambda group: group) -> list:
    """Groups (oldest first) in eviction order: needed by no task here first, then
    those needed last."""
    unused, ranked = [], []
    for order, group in enumerate(groups):
        r = rank_of(rank, keys_of(group))
        if r is None:
            unused.append(group)
        else:
            ranked.append((r, order, group))
    ranked.sort(key=lambda item: (item[0], item[1]), reverse=True)
    return unused + [g for _, _, g in ranked]


def device_victims(device: DeviceTier, stay, rank) -> list[list]:
    """Groups of device keys that share allocations, in eviction order. The keys in
    ``stay`` (those excluded and those a running task reads) stay, and so do the
    allocations they view; only those allocations: a key that views one of them and
    others too (the tuple of a qr task whose R a running task reads) may still go, and
    frees the others (its Q). Groups are joined through the allocations that can be
    freed alone, and a group that would free none is left out."""
    kept = {k for k in stay if k in device.holds}
    blocked = {a for k in kept for a in device.holds[k]}
    groups, seen = [], set(kept)
    for key in device.stored:
        if key in seen:
            continue
        group = device.connected({key}, blocked)
        seen |= group
        if all(a in blocked for k in group for a in device.holds[k]):
            continue  # its memory stays whatever moves
        groups.append([k for k in device.stored if k in group] if len(group) > 1 else [key])
    return ordered(groups, rank)


def over_device(stored_bytes: int, incoming: int, limit: int | None, usage: Callable[[], int] | None) -> int:
    """Bytes to free on the device before ``incoming`` more bytes fit: over the limit by
    what is stored, or by what is really allocated (``usage``, temporaries included);
    nothing without a limit (None)."""
    if limit is None:
        return 0
    over = stored_bytes + incoming - limit
    if usage is not None:
        over = max(over, usage() + incoming - limit)
    return over


def over_limit(held: int, incoming: int, limit: int | None) -> int:
    """Bytes a tier below the device holding ``held`` must move down before ``incoming``
    more bytes fit under its ``limit`` (None: no limit); what the machine has room for in
    host memory is checked per buffer (:class:`~spillway.memory.books.HostBooks`)."""
    if limit is None:
        return 0
    return held + incoming - limit
