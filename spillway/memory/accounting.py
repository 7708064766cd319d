"""What the tiered store holds where: the device tier (its keys and the allocations their
values view), and the spilled keys with the groups they left the device in and the tier
each group is in.

The device tier is counted by allocation, not by value: a key whose value views an
allocation that stored keys already view adds no bytes, and the allocation leaves the
count when the last key viewing it does. :meth:`DeviceTier.compacted` keeps a small
view from holding a large allocation it shares with nothing stored.

These are plain state and its bookkeeping: the caller holds the store's lock (see
:class:`spillway.memory.store.TieredStore`), none of it locks.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

from .groups import SpilledGroup, fill, strip
from .stats import MoveRates
from .tier import HOST

#: an array whose allocation is at least twice its extent, and this much larger, is
#: stored as a copy of its extent alone (see DeviceTier.compacted)
COMPACT_MIN_WASTE = 1 << 18
#: a view of an allocation that stored keys view too is copied when it spans at most
#: this fraction's inverse of it
SHARED_FACTOR = 8


@dataclass
class Allocation:
    """A device allocation that stored values view, and which keys do."""

    nbytes: int
    keys: set = field(default_factory=set)


class DeviceTier(MoveRates):
    """The device tier: its keys and values (least recently used first), the allocations
    each value views, and the bytes of those allocations (its usage; a
    :class:`~spillway.memory.tier.Tier`, whose values the store puts, reads and
    deletes by key, not a segment tier)."""

    name = "device"
    where = "the device"

    def __init__(self, limit: int | None = None, usage: Callable[[], int] | None = None):
        self.stored: OrderedDict = OrderedDict()  # key -> value, least recently used first
        self.holds: dict = {}  # key -> the allocations its value views
        self.allocations: dict[int, Allocation] = {}
        self.nbytes = 0
        #: bytes the stored values' allocations may take (None: no limit)
        self.limit = limit
        #: bytes really allocated on the device (RMM statistics), temporaries included
        self.usage = usage

    def room(self) -> int | None:
        if self.limit is None:
            return None
        return max(0, self.limit - max(self.nbytes, self.usage() if self.usage is not None else 0))

    def __contains__(self, key) -> bool:
        return key in self.stored

    def __len__(self) -> int:
        return len(self.stored)

    def insert(self, key, value, views) -> None:
        held = set()
        for v in views:
            if not v.allocation_bytes:
                continue
            allocation = self.allocations.get(v.allocation)
            if allocation is None:
                allocation = self.allocations[v.allocation] = Allocation(v.allocation_bytes)
                self.nbytes += v.allocation_bytes
            allocation.keys.add(key)
            held.add(v.allocation)
        self.stored[key] = value
        self.holds[key] = tuple(held)

    def remove(self, key) -> list:
        """Take a device key out; allocations no other key views leave the count. Returns
        the allocations other keys still view."""
        del self.stored[key]
        kept = []
        for a in self.holds.pop(key):
            allocation = self.allocations[a]
            allocation.keys.discard(key)
            if not allocation.keys:
                del self.allocations[a]
                self.nbytes -= allocation.nbytes
            else:
                kept.append(a)
        return kept

    def recompact(self, allocations, codec, stay=frozenset()) -> int:
        """Once a key leaves, the keys left viewing ``allocations`` may view a small part
        of them: a tuple's getitem (tsqr's R, a view of cuSOLVER's panel-sized workspace)
        stored while the tuple was, then the tuple released. Those keys are stored again
        as copies of their bytes (:meth:`compacted`), so the allocation can go; keys in
        ``stay`` (running tasks read them, so nothing would be freed) are left. Returns
        the device bytes given back."""
        before = self.nbytes
        for a in allocations:
            allocation = self.allocations.get(a)
            if allocation is None or allocation.keys & stay:
                continue
            keys = list(allocation.keys)  # not a scan of every stored key on each removal
            views = [v for k in keys for v in _views(self.stored[k], codec) if v.allocation == a]
            if not views or not _wasteful(allocation.nbytes, _covered(views)):
                continue
            values = {k: self.stored[k] for k in keys}
            for key in keys:  # all out first: a copy is made only once none views the allocation
                self.remove(key)
            for key in keys:
                self.insert(key, *self.compacted(values[key], codec))
        return before - self.nbytes

    def new_bytes(self, views) -> int:
        """Bytes of the allocations in ``views`` that no stored key views yet."""
        new = {v.allocation: v.allocation_bytes for v in views
               if v.allocation_bytes and v.allocation not in self.allocations}
        return sum(new.values())

    def compacted(self, value, codec) -> tuple[Any, list]:
        """``value`` with each array that views a small part of a large allocation (see
        :func:`_wasteful`) replaced by a copy of just its bytes; and the views of its
        arrays. The R factor of a qr task views the whole panel-sized workspace that
        cuSOLVER factored in place: kept as it is, a few MB of R would hold that panel on
        the device for as long as the key lives, and a task reading every R (tsqr's second
        stage) would hold them all."""
        arrays: list = []
        skeleton = strip(value, codec.is_device, lambda a: arrays.append(a) or len(arrays) - 1)
        views = [codec.view(a) for a in arrays]
        by_allocation: dict[int, list] = {}
        for v in views:
            if v.allocation_bytes:
                by_allocation.setdefault(v.allocation, []).append(v)
        wasteful = {a for a, vs in by_allocation.items()
                    if _wasteful(vs[0].allocation_bytes, _covered(vs), shared=a in self.allocations)}
        if not wasteful:
            return value, views
        try:
            arrays = [a.copy() if v.allocation in wasteful else a for a, v in zip(arrays, views)]
        except MemoryError:  # no room for the copies: keep the views, and their allocation
            return value, views
        return fill(skeleton, arrays), [codec.view(a) for a in arrays]

    def viewers(self, views) -> set:
        """The stored keys that view an allocation of ``views``."""
        return {k for v in views if v.allocation in self.allocations
                for k in self.allocations[v.allocation].keys}

    def connected(self, keys, blocked=frozenset()) -> set:
        """``keys`` and every device key that shares an allocation with them, transitively,
        not through the ``blocked`` allocations (ones that stay on the device anyway)."""
        group, todo = set(), [k for k in keys if k in self.holds]
        group.update(todo)
        while todo:
            for a in self.holds[todo.pop()]:
                if a in blocked:
                    continue
                for other in self.allocations[a].keys:
                    if other not in group:
                        group.add(other)
                        todo.append(other)
        return group

    def held_bytes(self, keys) -> int:
        """Bytes of the allocations that the device keys among ``keys`` view."""
        return sum(self.allocations[a].nbytes for a in
                   {a for k in keys if k in self.holds for a in self.holds[k]})


def _covered(views) -> int:
    """Bytes that ``views`` (of one allocation) hold: the smaller of their elements' bytes
    and the range they span. CuPy's R of a tall panel's qr is a 500 x 500 view strided
    across the whole 761 MiB workspace: it spans all of it and holds 2 MB."""
    low = min(v.extent[0] for v in views)
    high = max(v.extent[1] for v in views)
    return min(high - low, sum(v.nbytes for v in views))


def _wasteful(nbytes: int, covered: int, *, shared: bool = False) -> bool:
    """Whether views holding ``covered`` bytes of an allocation of ``nbytes`` hold it
    mostly for nothing: at most half of it, or where stored keys view it too (and keep
    it anyway), at most an eighth: the copy is small, and the value no longer ties the
    allocation to the device while a task reads it (tsqr's second stage reads every R,
    each a getitem of a (Q, R) tuple whose R views a panel-sized allocation)."""
    return nbytes - covered >= COMPACT_MIN_WASTE and nbytes >= (SHARED_FACTOR if shared else 2) * covered


def _views(value, codec) -> list:
    arrays: list = []
    strip(value, codec.is_device, lambda a: arrays.append(a) or len(arrays) - 1)
    return [codec.view(a) for a in arrays]


class SpilledKeys:
    """The keys off the device: the spilled group each belongs to, and the groups in each
    tier under the device (by the tier's place in the store's stack, oldest first). The
    bytes each tier holds are the tier's own count."""

    def __init__(self, tiers: int):
        self.group_of: dict = {}  # key -> id of its spilled group
        self.groups: dict[int, SpilledGroup] = {}
        #: tier's place -> ids of the groups in it, oldest first (the device's is empty)
        self.resident: list[OrderedDict] = [OrderedDict() for _ in range(tiers)]
        self._ids = itertools.count()

    @property
    def on_host(self) -> OrderedDict:
        """Ids of the groups in host buffers, oldest first."""
        return self.resident[HOST]

    def __contains__(self, key) -> bool:
        return key in self.group_of

    def __len__(self) -> int:
        return len(self.group_of)

    def tier_of(self, key) -> int | None:
        """The place of the tier ``key``'s group is in (None: not spilled)."""
        gid = self.group_of.get(key)
        if gid is None:
            return None
        return self.groups[gid].tier

    def add(self, group: SpilledGroup) -> int:
        """A group just copied to host buffers; returns its id."""
        gid = next(self._ids)
        self.put_back(gid, group)
        return gid

    def put_back(self, gid, group: SpilledGroup) -> None:
        """``group`` (its segments in the host tier) under ``gid``, its keys naming it."""
        group.tier = HOST
        self.groups[gid] = group
        self.resident[HOST][gid] = None
        for k in group.skeletons:
            self.group_of[k] = gid

    def moved(self, gid, source: int, target: int) -> None:
        del self.resident[source][gid]
        self.resident[target][gid] = None
        self.groups[gid].tier = target

    def key_counts(self) -> list[int]:
        """How many spilled keys each tier holds, by its place (the device's: 0)."""
        counts = [0] * len(self.resident)
        for gid in set(self.group_of.values()):
            group = self.groups[gid]
            counts[group.tier] += len(group.skeletons)
        return counts


class CleanCopies:
    """Host copies of values that were read back to the device and are still there,
    unchanged (a task's output never changes): the device keys of a group restored from
    the host tier keep its segments there, so that spilling the same keys again moves no
    byte. They are the first host memory given back when the host tier needs room
    (dropping one moves nothing either: the value is on the device)."""

    def __init__(self):
        #: group id -> the group whose segments the host tier still holds
        self.groups: dict[int, SpilledGroup] = {}
        #: device key -> the id of its clean group
        self.gid_of: dict = {}
        #: bytes of the clean groups' segments (counted in the host tier too)
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, gid, group: SpilledGroup) -> None:
        self.groups[gid] = group
        for k in group.skeletons:
            self.gid_of[k] = gid
        self.nbytes += group.nbytes

    def matching(self, keys) -> int | None:
        """The id of the clean group whose keys are exactly ``keys`` (None: none)."""
        gid = self.gid_of.get(next(iter(keys), None))
        if gid is None or set(self.groups[gid].skeletons) != set(keys):
            return None
        return gid

    def pop(self, gid) -> SpilledGroup:
        group = self.groups.pop(gid)
        for k in group.skeletons:
            del self.gid_of[k]
        self.nbytes -= group.nbytes
        return group
