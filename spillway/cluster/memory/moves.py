"""The tiered store's moves: device -> host -> disk and back, each timed in the stats.

A group of device keys (keys whose values share allocations) leaves the device together
as one :class:`~spillway.cluster.memory.groups.SpilledGroup`: every byte its views span
copied once into host buffers, later written to disk segment by segment. Restoring a key
brings its whole group back. A move that fails loses nothing: the values stay where
they were.

How much must move and in which order is the store's and
:mod:`spillway.cluster.memory.eviction`'s to say; the moves are handed the state they act
on and the ``make_room`` callables that free the tier they fill. The caller holds the
store's lock (see :class:`spillway.cluster.memory.store.TieredStore`), none of them locks;
only :func:`to_device`, which reads nothing but a group already taken off the tiers, runs
outside it for prefetches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

from .accounting import DeviceAccounts, SpilledKeys
from .codecs import HostCopy
from .disk import DiskTier
from .groups import SpilledGroup, fill, leaves, segments, strip
from .host import HostBuffers
from .stats import TierStats


class Means(NamedTuple):
    """What moves go through: the codec that copies values, the host buffers and disk
    that take them, and the stats that count each move."""

    codec: Any
    host: HostBuffers
    disk: DiskTier | None
    stats: TierStats


def device_to_host(device: DeviceAccounts, spilled: SpilledKeys, keys: list, means: Means,
                   make_host_room: Callable[[int], None]) -> int:
    """Copy the keys of one group to host buffers; returns the device bytes freed."""
    codec, host, stats = means.codec, means.host, means.stats
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
    try:
        for (begin, end) in ranges:
            buffers.append(codec.to_host(begin, end - begin, host.alloc))
    except BaseException:  # nothing lost: the values stay on the device
        for b in buffers:
            host.release(b)
        raise
    stats.add("device_to_host", n, time.perf_counter() - start)
    values.clear()  # our references go before the allocations leave the store
    arrays.clear()
    before = device.nbytes
    for k in keys:
        device.remove(k)
    spilled.add(SpilledGroup(skeletons, placements, buffers, sizes))
    return before - device.nbytes


def host_to_disk(spilled: SpilledKeys, order: list, need: int, means: Means) -> None:
    """Write host groups to disk, in ``order`` (their ids), until ``need`` bytes of host
    buffers are given back."""
    disk, host, stats = means.disk, means.host, means.stats
    for gid in order:
        if need <= 0:
            break
        group = spilled.groups[gid]
        start = time.perf_counter()
        written = []
        try:
            for i in group.live_segments():
                buffer = group.buffers[i]
                disk.write((gid, i), HostCopy((buffer.nbytes,), buffer.dtype, "C", buffer),
                           itemsize=_itemsize(group, i))
                written.append(i)
        except BaseException:  # nothing lost, nothing left: the group stays on the host
            for i in written:
                disk.delete((gid, i))
            raise
        stats.add("host_to_disk", group.nbytes, time.perf_counter() - start)
        for i in group.live_segments():
            host.release(group.buffers[i])
            group.buffers[i] = None
        group.on_disk = True
        del spilled.on_host[gid]
        spilled.host_bytes -= group.nbytes
        need -= group.nbytes


def _itemsize(group: SpilledGroup, segment: int) -> int:
    """The element size of the first view in ``segment`` (what a shuffle before
    compression groups the bytes by); 1 where none views it."""
    for p in group.placements:
        if p.segment == segment:
            return int(p.dtype.itemsize)
    return 1


def take_host_buffers(spilled: SpilledKeys, gid, means: Means) -> SpilledGroup:
    """Take a spilled group off the host or disk tier, its segments in host buffers (its
    keys still name it: the caller takes them off)."""
    group = spilled.groups.pop(gid)
    if not group.on_disk:
        del spilled.on_host[gid]
        spilled.host_bytes -= group.nbytes
        return group
    start = time.perf_counter()
    read = []
    try:
        for i in group.live_segments():
            group.buffers[i] = means.disk.read((gid, i), means.host.alloc).buffer
            read.append(i)
    except BaseException:
        for i in read:
            means.host.release(group.buffers[i])
            group.buffers[i] = None
        spilled.groups[gid] = group
        raise
    means.stats.add("disk_to_host", group.nbytes, time.perf_counter() - start)
    for i in read:
        means.disk.delete((gid, i))
    group.on_disk = False
    return group


def to_device(group: SpilledGroup, means: Means) -> dict:
    """The group's values on the device (outside the lock for prefetches)."""
    codec = means.codec
    start = time.perf_counter()
    allocations = {i: codec.to_device(group.buffers[i]) for i in group.live_segments()}
    arrays = [None if p.segment in group.dropped else
              codec.rebuild(allocations[p.segment], p.offset, p.shape, p.strides, p.dtype)
              for p in group.placements]
    means.stats.add("host_to_device", group.nbytes, time.perf_counter() - start)
    return {k: fill(sk, arrays) for k, sk in group.skeletons.items()}


def settle(device: DeviceAccounts, group: SpilledGroup, values: dict, means: Means) -> None:
    """Give the group's host buffers back and put its values in the device tier."""
    codec = means.codec
    for i in group.live_segments():
        means.host.release(group.buffers[i])
    for k, value in values.items():
        device.insert(k, value, [codec.view(a) for a in leaves(value, codec.is_device)])


def restore(device: DeviceAccounts, spilled: SpilledKeys, gid, means: Means,
            make_room: Callable[[int], None], *, read_first: bool = False) -> None:
    """Bring a spilled group back to the device, after ``make_room`` made room for it.

    A group in host buffers leaves the host tier before room is made: the values that
    move down then find its room there. A group on disk is read after, unless
    ``read_first``: making room first lets the values it moves free the host buffers the
    group is read into (slices of the pinned arena, not buffers taken on demand); reading
    first frees the group's files, which is the room those moves need where every tier is
    full."""
    read_first = read_first or not spilled.groups[gid].on_disk
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
        spilled.put_back(gid, group)
        raise
    settle(device, group, values, means)


def drop(spilled: SpilledKeys, key, means: Means) -> None:
    """Take a spilled key out, and give back the segments no remaining key of its group
    views (host buffers or disk files); the group goes with its last key."""
    gid = spilled.group_of.pop(key)
    group = spilled.groups[gid]
    del group.skeletons[key]
    for i in group.unviewed_segments():
        if group.on_disk:
            means.disk.delete((gid, i))
        else:
            means.host.release(group.buffers[i])
            group.buffers[i] = None
            spilled.host_bytes -= group.sizes[i]
        group.dropped.add(i)
    if not group.skeletons:
        del spilled.groups[gid]
        spilled.on_host.pop(gid, None)
