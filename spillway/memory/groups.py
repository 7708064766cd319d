"""Stored values as views of device allocations, and the spilled form of keys that share them.

A task's output is not always one array that owns its memory: a qr task returns a tuple
whose arrays the getitem tasks after it store again under their own keys, a slice views
its input's buffer, a chunk made from a larger array views that array. The store finds
the device arrays inside each value (tuples, lists and dicts are looked into), counts the
*allocations* they point into, and moves keys that share an allocation together: moving
only some of them would free nothing.

A spilled group keeps, per allocation, the byte ranges its views span (overlapping ranges
merged into one segment), and each view's place in its segment, so every byte is copied
once and the views come back sharing memory as they did.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .codecs import View
from .tier import HOST

#: containers whose items the store looks into (exactly these types: a subclass, such as a
#: namedtuple, would not be rebuilt by calling its type on a list of items)
CONTAINERS = (tuple, list, dict)


class Slot:
    """Where a device array stood in a value, in its spilled skeleton."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def leaves(value, is_device: Callable[[Any], bool]) -> list:
    """The device arrays inside ``value`` (itself, or items of its containers)."""
    if is_device(value):
        return [value]
    kind = type(value)
    if kind is dict:
        value = value.values()
    elif kind not in (tuple, list):
        return []
    return [leaf for item in value for leaf in leaves(item, is_device)]


def strip(value, is_device, place: Callable[[Any], int]):
    """``value`` with each device array replaced by a :class:`Slot` from ``place``."""
    if is_device(value):
        return Slot(place(value))
    kind = type(value)
    if kind is dict:
        return {k: strip(v, is_device, place) for k, v in value.items()}
    if kind in (tuple, list):
        return kind(strip(v, is_device, place) for v in value)
    return value


def fill(skeleton, arrays: list):
    """The value back from its skeleton, each slot replaced by its array."""
    if isinstance(skeleton, Slot):
        return arrays[skeleton.index]
    kind = type(skeleton)
    if kind is dict:
        return {k: fill(v, arrays) for k, v in skeleton.items()}
    if kind in (tuple, list):
        return kind(fill(v, arrays) for v in skeleton)
    return skeleton


def slots(skeleton) -> set[int]:
    if isinstance(skeleton, Slot):
        return {skeleton.index}
    kind = type(skeleton)
    if kind is dict:
        skeleton = skeleton.values()
    elif kind not in (tuple, list):
        return set()
    return set().union(*(slots(v) for v in skeleton))


@dataclass(frozen=True)
class ViewPlacement:
    """Where one view lies in its spilled group: the segment holding its bytes, its
    offset there, and the shape, strides and dtype it is rebuilt with."""

    segment: int
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype


def segments(views: list[View]) -> tuple[list[tuple[int, int]], list[ViewPlacement]]:
    """Address ranges to copy for ``views`` (overlapping ranges of one allocation merged)
    and each view's placement in them."""
    order = sorted(range(len(views)), key=lambda i: (views[i].allocation, views[i].extent))
    ranges: list[list[int]] = []
    owner: list[int] = [0] * len(views)
    last_allocation = None
    for i in order:
        start, end = views[i].extent
        if ranges and views[i].allocation == last_allocation and start <= ranges[-1][1]:
            ranges[-1][1] = max(ranges[-1][1], end)
        else:
            ranges.append([start, end])
            last_allocation = views[i].allocation
        owner[i] = len(ranges) - 1
    placements = [ViewPlacement(owner[i], v.ptr - ranges[owner[i]][0], v.shape, v.strides, v.dtype)
                  for i, v in enumerate(views)]
    return [(a, b) for a, b in ranges], placements


@dataclass
class SpilledGroup:
    """Keys that left the device together: their skeletons, the views' placements, the
    bytes of each segment, and the tier its segments are in (by its place in the stack).
    ``buffers`` holds a segment's host buffer while the group is off the tiers (being
    restored); the tiers hold them otherwise."""

    skeletons: dict[Hashable, Any]
    placements: list[ViewPlacement]
    buffers: list[np.ndarray | None]
    sizes: list[int]
    tier: int = HOST
    #: segments no remaining key views (their bytes were given back)
    dropped: set[int] = field(default_factory=set)

    @property
    def nbytes(self) -> int:
        return sum(n for i, n in enumerate(self.sizes) if i not in self.dropped)

    def live_segments(self) -> list[int]:
        return [i for i in range(len(self.sizes)) if i not in self.dropped]

    def unviewed_segments(self) -> list[int]:
        """Segments that no remaining key's views point into (after a key was deleted)."""
        used = {self.placements[s].segment for sk in self.skeletons.values() for s in slots(sk)}
        return [i for i in self.live_segments() if i not in used]
