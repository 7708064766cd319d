"""The tiered store's moves: down the stack one tier at a time and back, each timed in the
stats.

A group of device keys (keys whose values share allocations) leaves the device together
as one :class:`~spillway.memory.groups.SpilledGroup`: every byte its views span
copied once into host buffers (the host tier), later moved down a tier at a time
(:func:`lower`: host -> disk, and from there to any tier below), segment by segment.
Restoring a key brings its whole group back, from whichever tier it is in, through host
buffers. A move that fails loses nothing: the values stay where they were.

How much must move and in which order is the store's and
:mod:`spillway.memory.eviction`'s to say; the moves are handed the state they act
on and the ``make_room`` callables that free the tier they fill. The caller holds the
store's lock (see :class:`spillway.memory.store.TieredStore`), none of them locks;
only :func:`to_device`, which reads nothing but a group already taken off the tiers, runs
outside it for prefetches.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .accounting import DeviceTier, SpilledKeys
from .codecs import HostCopy
from .groups import SpilledGroup, fill, leaves, segments, strip
from .host import HostTier
from .stats import TierStats
from .tier import HOST, move_name


class Means(NamedTuple):
    """What moves go through: the codec that copies values, the tiers (fastest first:
    device, host, those below) and the stats that count each move."""

    codec: Any
    tiers: tuple
    stats: TierStats

    @property
    def host(self) -> HostTier:
        return self.tiers[HOST]


def device_to_host(device: DeviceTier, spilled: SpilledKeys, keys: list, means: Means,
                   make_host_room: Callable[[int], None]) -> int:
    """Copy the keys of one group to host buffers; returns the device bytes freed."""
    codec, tier, stats = means.codec, means.host, means.stats
    host = tier.buffers
    values = {k: device.stored[k] for k in keys}
    arrays, views, index = [], [], {}

    def place(array) -> int:
        view = codec.view(array)
        at = (view.ptr, view.shape, view.strides, view.dtype.str)
        if at not in index:
            index[at] = len(views)
            arrays.append(array)
            views.append(view)
        return index[at]

    skeletons = {k: strip(v, codec.is_device, place) for k, v in values.items()}
    ranges, placements = segments(views)
    sizes = [end - start for start, end in ranges]
    n = sum(sizes)
    # Free the host tier first: with the host tier at its limit the pinned arena
    # (sized to that limit) is full, and the copy would land in a buffer pinned on
    # demand (a slow first allocation, and pinned memory beyond the arena).
    make_host_room(n)
    waited = time.perf_counter()
    # On a busy GPU the values may still be being computed; the copy cannot start
    # before they are, and that wait is compute, not spilling.
    codec.ready(arrays[0] if arrays else None)
    start = time.perf_counter()
    stats.producer_wait_s += start - waited
    buffers = []
    alloc_s = 0.0

    def alloc(nbytes: int):
        nonlocal alloc_s
        began = time.perf_counter()
        try:
            return host.alloc(nbytes)
        finally:
            alloc_s += time.perf_counter() - began

    try:
        for (begin, end) in ranges:
            buffers.append(codec.to_host(begin, end - begin, alloc))
    except BaseException:  # nothing lost: the values stay on the device
        for b in buffers:
            host.release(b)
        raise
    # the move's seconds are the copy and its buffers together (what the spill waited);
    # the buffers' share apart, since a rate that falls there is the host's, not the link's
    stats.add(move_name(device.name, tier.name), n, time.perf_counter() - start)
    stats.spill_alloc_s += alloc_s
    values.clear()  # our references go before the allocations leave the store
    arrays.clear()
    before = device.nbytes
    for k in keys:
        device.remove(k)
    group = SpilledGroup(skeletons, placements, [None] * len(buffers), sizes)
    gid = spilled.add(group)
    for i, buffer in enumerate(buffers):
        tier.put((gid, i), _whole(buffer))
    return before - device.nbytes


def lower(spilled: SpilledKeys, level: int, order: list, need: int, means: Means,
          make_room: Callable[[int], None] | None = None) -> None:
    """Move groups of the tier at ``level`` to the tier below it, in ``order`` (their ids),
    until ``need`` bytes of it are given back; ``make_room(n)`` frees the tier below for
    each group's bytes first (None: it has no tier below it to free)."""
    source, target, stats = means.tiers[level], means.tiers[level + 1], means.stats
    move = move_name(source.name, target.name)
    for gid in order:
        if need <= 0:
            break
        group = spilled.groups[gid]
        if make_room is not None:
            make_room(group.nbytes)
        stats.add(move, group.nbytes, _write_segments(group, gid, source, target))
        for i in group.live_segments():
            source.delete((gid, i))
        spilled.moved(gid, level, level + 1)
        need -= group.nbytes


def _write_segments(group: SpilledGroup, gid, source, target) -> float:
    """Put each live segment of ``group`` from ``source`` in ``target``; returns the
    seconds it took. A write that fails leaves nothing in ``target`` (nothing lost: the
    group stays where it was)."""
    start = time.perf_counter()
    written = []
    try:
        for i in group.live_segments():
            # from the host, the host tier's own buffer; from further down, a buffer of the
            # move's own that goes once the tier below has the bytes
            target.put((gid, i), source.get((gid, i), _transit), itemsize=_itemsize(group, i))
            written.append(i)
    except BaseException:
        for i in written:
            target.delete((gid, i))
        raise
    return time.perf_counter() - start


def take_to_lower(spilled: SpilledKeys, gid) -> SpilledGroup:
    """Take a host group off the host's order for a write to the tier below outside the
    lock (:func:`write_down`): its segments stay in the host tier (counted there, their
    buffers the write's source) and its keys are the caller's to hold in flight."""
    group = spilled.groups.pop(gid)
    del spilled.resident[HOST][gid]
    for k in group.skeletons:
        del spilled.group_of[k]
    return group


def write_down(group: SpilledGroup, gid, means: Means) -> float:
    """Write a group taken by :func:`take_to_lower` to the tier below the host (no lock
    held: nothing else touches its keys meanwhile); returns the seconds it took. A write
    that fails leaves nothing below."""
    return _write_segments(group, gid, means.tiers[HOST], means.tiers[HOST + 1])


def settle_lowered(spilled: SpilledKeys, gid, group: SpilledGroup, means: Means, seconds: float) -> None:
    """A group :func:`write_down` wrote: its host buffers given back, the group and its
    keys in the tier below."""
    source, target = means.tiers[HOST], means.tiers[HOST + 1]
    for i in group.live_segments():
        source.delete((gid, i))
    spilled.put_back(gid, group)
    spilled.moved(gid, HOST, HOST + 1)
    means.stats.add(move_name(source.name, target.name), group.nbytes, seconds)


def _transit(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, dtype=np.uint8)


def _whole(buffer: np.ndarray) -> HostCopy:
    return HostCopy((buffer.nbytes,), buffer.dtype, "C", buffer)


def _itemsize(group: SpilledGroup, segment: int) -> int:
    """The element size of the first view in ``segment`` (what a shuffle before
    compression groups the bytes by); 1 where none views it."""
    for p in group.placements:
        if p.segment == segment:
            return int(p.dtype.itemsize)
    return 1


def take_host_buffers(spilled: SpilledKeys, gid, means: Means) -> SpilledGroup:
    """Take a spilled group off the tier it is in, its segments in host buffers held in
    ``group.buffers`` (its keys still name it: the caller takes them off)."""
    group = spilled.groups[gid]
    level, host = group.tier, means.host
    if level == HOST:
        for i in group.live_segments():
            group.buffers[i] = host.take((gid, i))
        del spilled.groups[gid]
        del spilled.resident[level][gid]
        return group
    source = means.tiers[level]
    start = time.perf_counter()
    read = []
    try:
        for i in group.live_segments():
            group.buffers[i] = source.get((gid, i), host.buffers.alloc).buffer
            read.append(i)
    except BaseException:
        for i in read:
            host.buffers.release(group.buffers[i])
            group.buffers[i] = None
        raise
    means.stats.add(move_name(source.name, host.name), group.nbytes, time.perf_counter() - start)
    for i in read:
        source.delete((gid, i))
    del spilled.groups[gid]
    del spilled.resident[level][gid]
    group.tier = HOST
    return group


def put_back(spilled: SpilledKeys, gid, group: SpilledGroup, means: Means) -> None:
    """A group whose restore failed goes back to the host tier, its keys naming it again:
    nothing is lost."""
    host = means.host
    for i in group.live_segments():
        host.put((gid, i), _whole(group.buffers[i]))
        group.buffers[i] = None
    spilled.put_back(gid, group)


def to_device(group: SpilledGroup, means: Means) -> dict:
    """The group's values on the device (outside the lock for prefetches)."""
    codec = means.codec
    start = time.perf_counter()
    allocations = {i: codec.to_device(group.buffers[i]) for i in group.live_segments()}
    arrays = [None if p.segment in group.dropped else
              codec.rebuild(allocations[p.segment], p.offset, p.shape, p.strides, p.dtype)
              for p in group.placements]
    means.stats.add(move_name(means.host.name, means.tiers[0].name), group.nbytes, time.perf_counter() - start)
    return {k: fill(sk, arrays) for k, sk in group.skeletons.items()}


def settle(device: DeviceTier, group: SpilledGroup, values: dict, means: Means,
           keep: Callable[[SpilledGroup], bool] | None = None) -> None:
    """Put the group's values in the device tier, and give its host buffers back unless
    ``keep(group)`` takes them (a clean copy of the values: see
    :class:`~spillway.memory.accounting.CleanCopies`)."""
    codec, buffers = means.codec, means.host.buffers
    kept = keep is not None and keep(group)
    for i in group.live_segments():
        if not kept:
            buffers.release(group.buffers[i])
        group.buffers[i] = None
    for k, value in values.items():
        device.insert(k, value, [codec.view(a) for a in leaves(value, codec.is_device)])


def restore(device: DeviceTier, spilled: SpilledKeys, gid, means: Means,
            make_room: Callable[[int], None], *, read_first: bool = False,
            keep: Callable[[int, SpilledGroup], bool] | None = None) -> None:
    """Bring a spilled group back to the device, after ``make_room`` made room for it.

    A group in host buffers leaves the host tier before room is made: the values that
    move down then find its room there. A group below the host (on disk) is read after,
    unless ``read_first``: making room first lets the values it moves free the host
    buffers the group is read into (slices of the pinned arena, not buffers taken on
    demand); reading first frees the group's files, which is the room those moves need
    where every tier is full."""
    read_first = read_first or spilled.groups[gid].tier == HOST
    if not read_first:
        make_room(spilled.groups[gid].nbytes)
    group = take_host_buffers(spilled, gid, means)
    for k in group.skeletons:
        del spilled.group_of[k]
    try:
        if read_first:
            make_room(group.nbytes)
        values = to_device(group, means)
    except BaseException:
        put_back(spilled, gid, group, means)
        raise
    settle(device, group, values, means, None if keep is None else functools.partial(keep, gid))


def keep_on_host(gid, group: SpilledGroup, means: Means) -> None:
    """Put a restored group's host buffers in the host tier under its id (a clean copy of
    values now on the device)."""
    host = means.host
    for i in group.live_segments():
        host.put((gid, i), _whole(group.buffers[i]))


def drop(spilled: SpilledKeys, key, means: Means) -> None:
    """Take a spilled key out, and give back the segments no remaining key of its group
    views (host buffers, disk files); the group goes with its last key."""
    gid = spilled.group_of.pop(key)
    group = spilled.groups[gid]
    del group.skeletons[key]
    tier = means.tiers[group.tier]
    for i in group.unviewed_segments():
        tier.delete((gid, i))
        group.dropped.add(i)
    if not group.skeletons:
        del spilled.groups[gid]
        spilled.resident[group.tier].pop(gid, None)
