"""What a tier of the store is, and the names of the moves between tiers.

The store's tiers stand fastest first: the device, then the host, then any number of
tiers below the host (the disk; a second disk, in tests a tier that counts its calls).
Every tier says its name (in :meth:`~spillway.memory.store.TieredStore.tier_of`
and in the names of moves), its usage (:attr:`Tier.nbytes`), its capacity
(:attr:`Tier.limit`, and :meth:`Tier.room`: what it can take now) and its rates.

The device holds values (arrays, and containers of them), counted by the allocations
they view (:class:`~spillway.memory.accounting.DeviceTier`). Every tier under it
holds *segments*: the byte ranges a spilled group's values span, as
:class:`~spillway.memory.codecs.HostCopy`, each under a ``(group, segment)`` key,
through :class:`SegmentTier`'s put, get and delete (the host tier,
:class:`~spillway.memory.host.HostTier`, keeps them in host buffers; the disk
tier, :class:`~spillway.memory.disk.DiskTier`, in files). A group lives in one
tier at a time; it moves down one tier at a time, and comes back up to the device
through host buffers whichever tier it is in (:mod:`spillway.memory.moves`).

A move is named ``"<from>_to_<to>"`` by its tiers' names: a stack of device, host and
disk has the four moves :data:`MOVES` that the stats, the worker plugin's counters and
the run reports name.
"""

from __future__ import annotations

import errno
from collections.abc import Hashable, Sequence
from typing import Protocol, runtime_checkable

from .codecs import Alloc, HostCopy

#: places in the stack: the device's and the host's (the tiers below follow)
DEVICE, HOST = 0, 1
#: errors that say a tier has no room for what it is given (a full filesystem, a quota)
FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
#: the moves of the device -> host -> disk stack, in the order reports list them
MOVES = ("device_to_host", "host_to_device", "host_to_disk", "disk_to_host")


@runtime_checkable
class Tier(Protocol):
    """What every tier of the store says of itself."""

    #: its name in tier_of, in summaries and in the names of moves
    name: str
    #: where it keeps what it holds, for messages (a directory, "host memory")
    where: str
    #: bytes it may hold (None: what it has room for)
    limit: int | None

    @property
    def nbytes(self) -> int:
        """Bytes it holds now."""

    def room(self) -> int | None:
        """Bytes more it can take now (None: no bound it knows of)."""

    def rates(self) -> dict:
        """Bytes per second values are written to it (``write``) and read from it
        (``read``), and where each figure comes from (``write_from``, ``read_from``;
        None while it has none)."""


@runtime_checkable
class SegmentTier(Tier, Protocol):
    """A tier below the device: it keeps spilled segments under ``(group, segment)`` keys."""

    def put(self, key: Hashable, copy: HostCopy, itemsize: int = 8) -> None:
        """Keep ``copy`` under ``key`` (``itemsize``: the element size of its bytes, which
        a tier that compresses groups them by). A put that fails leaves nothing behind;
        one with no room raises the :class:`OSError` of a full filesystem (``ENOSPC``).
        The tier below the host takes puts from the store's drain thread beside the other
        calls (never two calls on one key at once): it keeps its own counts whole."""

    def get(self, key: Hashable, alloc: Alloc) -> HostCopy:
        """What ``key`` holds, in host memory (a buffer from ``alloc`` where it must be
        copied there); the tier keeps it until :meth:`delete`."""

    def delete(self, key: Hashable) -> None:
        """Give back what ``key`` holds."""

    def close(self) -> None:
        """Give back everything (the worker is closing)."""


def is_full(error: BaseException) -> bool:
    """Whether ``error`` is a tier that ran out of room (a filesystem's, or its quota)."""
    return isinstance(error, OSError) and error.errno in FULL


def raw_nbytes(tier: Tier) -> int:
    """Bytes of the values ``tier`` holds: a tier that compresses them (the disk) counts
    them in ``raw_nbytes`` beside its stored :attr:`~Tier.nbytes`; any other holds them at
    their size."""
    return getattr(tier, "raw_nbytes", tier.nbytes)


def move_name(source: str, target: str) -> str:
    return f"{source}_to_{target}"


def moves_of(names: Sequence[str]) -> tuple[str, ...]:
    """The moves between tiers named ``names`` (fastest first): down one tier at a time,
    and from each tier under the host back to host buffers (the way to the device)."""
    device, host, *below = names
    out = [move_name(device, host), move_name(host, device)]
    above = host
    for name in below:
        out += [move_name(above, name), move_name(name, host)]
        above = name
    return tuple(out)


def check_names(names: Sequence[str]) -> None:
    if len(names) < 2 or len(set(names)) != len(names):
        raise ValueError(f"the tiers need a device and a host tier and a name each, not {list(names)}")
