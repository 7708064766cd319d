"""The worker's tiered store: device -> host -> disk.

A MutableMapping that a distributed Worker uses as its ``data``. Values live on the
device until the device tier passes its limit; then the values needed last move to host
buffers (slices of a pinned arena when there is one), and past the host limit to disk.
Reading a spilled value restores it. Three things make this faster than counting stored
outputs against a limit:

* **eviction by next use**: a ``rank`` callable (see :mod:`spillway.service.memory.policy`) says
  when each key is needed next by the tasks queued on the worker; keys nobody here waits
  for go first, then those needed last;
* **prefetch**: :meth:`prefetch` restores the inputs of the next queued tasks on a
  background thread (copies outside the store's lock), so tasks find them on the device;
* **spill on demand**: :meth:`evict_for` frees device memory that no running task reads
  when an allocation fails (RMM calls it, see :mod:`spillway.service.plugins`).

The device tier is counted by allocation, not by value: keys whose values view one
allocation (slices, the arrays of a tuple that later keys also store) count it once and
move together (:mod:`spillway.service.memory.groups`); values inside tuples, lists and dicts are
device values too.

The store only moves values through its ``codec`` (CuPy on GPUs, NumPy in CPU tests) and
counts what it moved and how long it took in :class:`TierStats`.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from ..sizes import format_bytes
from .codecs import HostCopy
from .disk import DiskTier
from .groups import SpilledGroup, fill, leaves, segments, strip
from .host import HostBuffers

logger = logging.getLogger("spillway.memory")

MOVES = ("device_to_host", "host_to_device", "host_to_disk", "disk_to_host")

#: an array whose allocation is at least twice its extent, and this much larger, is
#: stored as a copy of its extent alone (see TieredStore._compacted)
COMPACT_MIN_WASTE = 1 << 18


@dataclass
class TierStats:
    bytes: dict = field(default_factory=lambda: dict.fromkeys(MOVES, 0))
    seconds: dict = field(default_factory=lambda: dict.fromkeys(MOVES, 0.0))
    count: dict = field(default_factory=lambda: dict.fromkeys(MOVES, 0))
    #: time reads waited for a restore (a task's inputs coming back)
    wait_s: float = 0.0
    #: time spills waited for the kernels still producing the value, before its copy
    #: started (left out of the device -> host seconds, which time the copy alone)
    producer_wait_s: float = 0.0
    prefetched_bytes: int = 0
    ondemand_events: int = 0
    ondemand_bytes: int = 0

    def add(self, move: str, nbytes: int, seconds: float) -> None:
        self.bytes[move] += nbytes
        self.seconds[move] += seconds
        self.count[move] += 1

    def to_json(self) -> dict:
        return {
            "bytes": dict(self.bytes),
            "seconds": dict(self.seconds),
            "count": dict(self.count),
            "wait_s": self.wait_s,
            "producer_wait_s": self.producer_wait_s,
            "prefetched_bytes": self.prefetched_bytes,
            "ondemand_events": self.ondemand_events,
            "ondemand_bytes": self.ondemand_bytes,
        }


@dataclass
class _Allocation:
    """A device allocation that stored values view, and which keys do."""

    nbytes: int
    keys: set = field(default_factory=set)


class TieredStore(MutableMapping):
    def __init__(
        self,
        *,
        device_limit: int,
        host_limit: int,
        codec,
        disk: DiskTier | None = None,
        host: HostBuffers | None = None,
        rank: Callable[[Hashable], Any] | None = None,
        device_usage: Callable[[], int] | None = None,
        in_use: Callable[[], Collection] | None = None,
        host_available: Callable[[], int] | None = None,
        host_headroom: int = 0,
    ):
        self.device_limit = int(device_limit)
        self.host_limit = int(host_limit)
        self.codec = codec
        self.disk = disk
        self.host = host or HostBuffers()
        #: key -> when it is needed next (smaller is sooner; None: not needed here)
        self.rank = rank
        #: bytes really allocated on the device (RMM statistics), temporaries included
        self.device_usage = device_usage
        #: keys that running tasks are reading: never moved (it would free nothing)
        self.in_use = in_use
        #: host memory the machine has available now, and how much of it spills must
        #: leave free: the host tier goes to disk before the kernel kills the process,
        #: whatever else holds the machine's memory (other processes, dirty page cache)
        self.host_available = host_available
        self.host_headroom = int(host_headroom)
        #: what the store starts once its worker has started (the pinned arena's growth:
        #: see :meth:`start`)
        self.on_start: list[Callable[[], Any]] = []
        #: the worker's name in messages (set by the worker plugin)
        self.name = "this worker"
        self.stats = TierStats()
        self._device: OrderedDict = OrderedDict()  # key -> value, least recently used first
        self._holds: dict = {}  # device key -> the allocations its value views
        self._allocations: dict[int, _Allocation] = {}
        self._plain: dict = {}
        self._spilled: dict = {}  # key -> id of its spilled group
        self._groups: dict[int, SpilledGroup] = {}
        self._host: OrderedDict = OrderedDict()  # ids of groups in host buffers, oldest first
        self._group_ids = itertools.count()
        self.device_bytes = 0
        self.host_bytes = 0
        self._lock = threading.RLock()
        self._inflight: dict = {}
        self._local = threading.local()

    # --- MutableMapping

    def __setitem__(self, key, value) -> None:
        while True:
            with self._lock:
                event = self._inflight.get(key)
                if event is None:
                    if key in self:
                        self._remove(key)
                    if not leaves(value, self.codec.is_device):
                        self._plain[key] = value
                        return
                    value, views = self._compacted(value)
                    new = {v.allocation: v.allocation_bytes for v in views
                           if v.allocation_bytes and v.allocation not in self._allocations}
                    # the keys already viewing this value's memory stay with it: moving
                    # them would free nothing
                    self._make_room(sum(new.values()), exclude={key} | self._viewers(views))
                    self._insert(key, value, views)
                    return
            event.wait()

    def __getitem__(self, key):
        while True:
            with self._lock:
                if key in self._device:
                    self._device.move_to_end(key)
                    return self._device[key]
                if key in self._plain:
                    return self._plain[key]
                event = self._inflight.get(key)
                if event is None:
                    if key not in self._spilled:
                        raise KeyError(key)
                    start = time.perf_counter()
                    self._restore(self._spilled[key])
                    self.stats.wait_s += time.perf_counter() - start
                    return self._device[key]
            event.wait()  # a prefetch is bringing it back

    def __delitem__(self, key) -> None:
        while True:
            with self._lock:
                event = self._inflight.get(key)
                if event is None:
                    if key not in self:
                        raise KeyError(key)
                    self._remove(key)
                    return
            event.wait()

    def __contains__(self, key) -> bool:
        return key in self._device or key in self._plain or key in self._spilled or key in self._inflight

    def __iter__(self):
        with self._lock:
            return iter(list(self._device) + list(self._plain) + list(self._spilled) + list(self._inflight))

    def __len__(self) -> int:
        return len(self._device) + len(self._plain) + len(self._spilled) + len(self._inflight)

    # --- where things are

    def tier_of(self, key) -> str | None:
        if key in self._device:
            return "device"
        if key in self._plain:
            return "plain"
        gid = self._spilled.get(key)
        if gid is not None:
            return "disk" if self._groups[gid].on_disk else "host"
        if key in self._inflight:
            return "moving"
        return None

    def summary(self) -> dict:
        spilled = [self._groups[g] for g in set(self._spilled.values())]
        return {
            "device_bytes": self.device_bytes,
            "host_bytes": self.host_bytes,
            "disk_bytes": self.disk.nbytes if self.disk is not None else 0,
            "device_keys": len(self._device),
            "device_buffers": len(self._allocations),
            "host_keys": sum(len(g.skeletons) for g in spilled if not g.on_disk),
            "disk_keys": sum(len(g.skeletons) for g in spilled if g.on_disk),
            "host_pinned_on_demand_bytes": self.host.pinned_bytes,
            "host_pageable_total": self.host.pageable_total,
            "host": self.host.summary(),
            "stats": self.stats.to_json(),
        }

    def exhausted(self, nbytes: int) -> str:
        """One line for a device allocation that nothing more could make room for."""
        with self._lock:
            running = self._running()
            in_use = sum(self._allocations[a].nbytes for a in
                         {a for k in running if k in self._holds for a in self._holds[k]})
            disk = self.disk.nbytes if self.disk is not None else 0
            return (f"{self.name}: cannot allocate {format_bytes(nbytes)} on the device and nothing "
                    f"more can be spilled: device {format_bytes(self.device_bytes)} stored "
                    f"({format_bytes(in_use)} in use by running tasks) of a "
                    f"{format_bytes(self.device_limit)} limit, host {format_bytes(self.host_bytes)}, "
                    f"disk {format_bytes(disk)}; use smaller chunks or more workers")

    # --- the device tier's bookkeeping (callers hold the lock)

    def _insert(self, key, value, views) -> None:
        held = set()
        for v in views:
            if not v.allocation_bytes:
                continue
            allocation = self._allocations.get(v.allocation)
            if allocation is None:
                allocation = self._allocations[v.allocation] = _Allocation(v.allocation_bytes)
                self.device_bytes += v.allocation_bytes
            allocation.keys.add(key)
            held.add(v.allocation)
        self._device[key] = value
        self._holds[key] = tuple(held)

    def _compacted(self, value) -> tuple[Any, list]:
        """``value`` with each array that views a small part of a large allocation, which
        no stored key views, replaced by a copy of just its bytes; and the views of its
        arrays. The R factor of a qr task views the whole panel-sized workspace that
        cuSOLVER factored in place: kept as it is, a few MB of R would hold that panel on
        the device for as long as the key lives, and a task reading every R (tsqr's second
        stage) would hold them all."""
        arrays: list = []
        skeleton = strip(value, self.codec.is_device, lambda a: arrays.append(a) or len(arrays) - 1)
        views = [self.codec.view(a) for a in arrays]
        spans: dict[int, list] = {}
        for v in views:
            if v.allocation_bytes and v.allocation not in self._allocations:
                low, high = v.extent
                span = spans.setdefault(v.allocation, [low, high, v.allocation_bytes])
                span[0], span[1] = min(span[0], low), max(span[1], high)
        wasteful = {a for a, (low, high, n) in spans.items()
                    if n - (high - low) >= COMPACT_MIN_WASTE and n >= 2 * (high - low)}
        if not wasteful:
            return value, views
        try:
            arrays = [a.copy() if v.allocation in wasteful else a for a, v in zip(arrays, views)]
        except MemoryError:  # no room for the copies: keep the views, and their allocation
            return value, views
        return fill(skeleton, arrays), [self.codec.view(a) for a in arrays]

    def _viewers(self, views) -> set:
        return {k for v in views if v.allocation in self._allocations
                for k in self._allocations[v.allocation].keys}

    def _connected(self, keys, blocked=frozenset()) -> set:
        """``keys`` and every device key that shares an allocation with them, transitively,
        not through the ``blocked`` allocations (ones that stay on the device anyway)."""
        group, todo = set(), [k for k in keys if k in self._holds]
        group.update(todo)
        while todo:
            for a in self._holds[todo.pop()]:
                if a in blocked:
                    continue
                for other in self._allocations[a].keys:
                    if other not in group:
                        group.add(other)
                        todo.append(other)
        return group

    def _remove(self, key) -> None:
        if key in self._device:
            del self._device[key]
            for a in self._holds.pop(key):
                allocation = self._allocations[a]
                allocation.keys.discard(key)
                if not allocation.keys:
                    del self._allocations[a]
                    self.device_bytes -= allocation.nbytes
        elif key in self._plain:
            del self._plain[key]
        elif key in self._spilled:
            gid = self._spilled.pop(key)
            group = self._groups[gid]
            del group.skeletons[key]
            self._drop_segments(gid, group, group.unviewed_segments())

    def _drop_segments(self, gid, group: SpilledGroup, which) -> None:
        """Give back the host buffers or disk files of segments ``which`` of a spilled group."""
        for i in which:
            if group.on_disk:
                self.disk.delete((gid, i))
            else:
                self.host.release(group.buffers[i])
                group.buffers[i] = None
                self.host_bytes -= group.sizes[i]
            group.dropped.add(i)
        if not group.skeletons:
            del self._groups[gid]
            self._host.pop(gid, None)

    def _running(self) -> set:
        if self.in_use is None:
            return set()
        for _ in range(3):
            try:
                return set(self.in_use())
            except RuntimeError:  # the worker's event loop changed its tasks while we read
                continue
        return set()

    # --- eviction order

    def _rank_of(self, keys) -> Any:
        """When the soonest of ``keys`` is needed here (None: by no task here)."""
        if self.rank is None:
            return None
        ranks = [r for r in map(self.rank, keys) if r is not None]
        return min(ranks) if ranks else None

    def _ordered(self, groups: list, keys_of=lambda group: group) -> list:
        """Groups (oldest first) in eviction order: needed by no task here first, then
        those needed last."""
        unused, ranked = [], []
        for order, group in enumerate(groups):
            r = self._rank_of(keys_of(group))
            if r is None:
                unused.append(group)
            else:
                ranked.append((r, order, group))
        ranked.sort(key=lambda item: (item[0], item[1]), reverse=True)
        return unused + [g for _, _, g in ranked]

    def _device_victims(self, exclude) -> list[list]:
        """Groups of device keys that share allocations, in eviction order. The excluded
        keys and those a running task reads stay, and so do the allocations they view;
        only those allocations: a key that views one of them and others too (the tuple of
        a qr task whose R a running task reads) may still go, and frees the others (its
        Q). Groups are joined through the allocations that can be freed alone, and a group
        that would free none is left out."""
        kept = {k for k in set(exclude) | self._running() if k in self._holds}
        blocked = {a for k in kept for a in self._holds[k]}
        groups, seen = [], set(kept)
        for key in self._device:
            if key in seen:
                continue
            group = self._connected({key}, blocked)
            seen |= group
            if all(a in blocked for k in group for a in self._holds[k]):
                continue  # its memory stays whatever moves
            groups.append([k for k in self._device if k in group] if len(group) > 1 else [key])
        return self._ordered(groups)

    def _over_device(self, incoming: int) -> int:
        """Bytes to free on the device before ``incoming`` more bytes fit."""
        over = self.device_bytes + incoming - self.device_limit
        if self.device_usage is not None:
            over = max(over, self.device_usage() + incoming - self.device_limit)
        return over

    def _make_room(self, incoming: int, exclude=()) -> None:
        need = self._over_device(incoming)
        if need <= 0:
            return
        for group in self._device_victims(exclude):
            if need <= 0:
                break
            need -= self._device_to_host(group)

    # --- moves (callers hold the lock)

    def _device_to_host(self, keys: list) -> int:
        """Copy the keys of one group to host buffers; returns the device bytes freed."""
        if self.on_start:
            self.start()
        values = {k: self._device[k] for k in keys}
        arrays, views, index = [], [], {}

        def place(array) -> int:
            view = self.codec.view(array)
            at = (view.ptr, view.shape, view.strides, view.dtype.str)
            if at not in index:
                index[at] = len(views)
                arrays.append(array)
                views.append(view)
            return index[at]

        skeletons = {k: strip(v, self.codec.is_device, place) for k, v in values.items()}
        ranges, placements = segments(views)
        sizes = [end - start for start, end in ranges]
        n = sum(sizes)
        # Free the host tier first: with the host tier at its limit the pinned arena
        # (sized to that limit) is full, and the copy would land in a buffer pinned on
        # demand (a slow first allocation, and pinned memory beyond the arena).
        self._spill_host(n)
        waited = time.perf_counter()
        # On a busy GPU the values may still be being computed; the copy cannot start
        # before they are, and that wait is compute, not spilling.
        self.codec.ready(arrays[0] if arrays else None)
        start = time.perf_counter()
        self.stats.producer_wait_s += start - waited
        buffers = []
        try:
            for (begin, end) in ranges:
                buffers.append(self.codec.to_host(begin, end - begin, self.host.alloc))
        except BaseException:  # nothing lost: the values stay on the device
            for b in buffers:
                self.host.release(b)
            raise
        self.stats.add("device_to_host", n, time.perf_counter() - start)
        values.clear()  # our references go before the allocations leave the store
        arrays.clear()
        before = self.device_bytes
        for k in keys:
            self._remove(k)
        gid = next(self._group_ids)
        self._groups[gid] = SpilledGroup(skeletons, placements, buffers, sizes)
        self._host[gid] = None
        for k in keys:
            self._spilled[k] = gid
        self.host_bytes += n
        return before - self.device_bytes

    def _spill_host(self, incoming: int) -> None:
        """Write host groups to disk until ``incoming`` more bytes fit under the host limit,
        and, unless the pinned arena (memory already taken) holds them, leave the host's
        headroom free (or the host tier is empty: a group larger than the limit still goes
        to host)."""
        need = self.host_bytes + incoming - self.host_limit
        if self.host_available is not None and not self.host.arena_can_take(incoming):
            need = max(need, incoming + self.host_headroom - self.host_available())
        if need <= 0 or self.disk is None:
            return
        for gid in self._ordered(list(self._host), keys_of=lambda g: self._groups[g].skeletons):
            if need <= 0:
                break
            group = self._groups[gid]
            start = time.perf_counter()
            for i in group.live_segments():
                buffer = group.buffers[i]
                self.disk.write((gid, i), HostCopy((buffer.nbytes,), buffer.dtype, "C", buffer))
            self.stats.add("host_to_disk", group.nbytes, time.perf_counter() - start)
            for i in group.live_segments():
                self.host.release(group.buffers[i])
                group.buffers[i] = None
            group.on_disk = True
            del self._host[gid]
            self.host_bytes -= group.nbytes
            need -= group.nbytes

    def _take_host_buffers(self, gid) -> SpilledGroup:
        """Take a spilled group off the host or disk tier, its segments in host buffers."""
        group = self._groups.pop(gid)
        if not group.on_disk:
            del self._host[gid]
            self.host_bytes -= group.nbytes
            return group
        start = time.perf_counter()
        read = []
        try:
            for i in group.live_segments():
                group.buffers[i] = self.disk.read((gid, i), self.host.alloc).buffer
                read.append(i)
        except BaseException:
            for i in read:
                self.host.release(group.buffers[i])
                group.buffers[i] = None
            self._groups[gid] = group
            raise
        self.stats.add("disk_to_host", group.nbytes, time.perf_counter() - start)
        for i in read:
            self.disk.delete((gid, i))
        group.on_disk = False
        return group

    def _put_back(self, gid, group: SpilledGroup) -> None:
        """A group whose restore failed goes back to the host tier: nothing is lost."""
        self._groups[gid] = group
        self._host[gid] = None
        self.host_bytes += group.nbytes
        for k in group.skeletons:
            self._spilled[k] = gid

    def _to_device(self, group: SpilledGroup) -> dict:
        """The group's values on the device (outside the lock for prefetches)."""
        start = time.perf_counter()
        allocations = {i: self.codec.to_device(group.buffers[i]) for i in group.live_segments()}
        arrays = [None if p.segment in group.dropped else
                  self.codec.rebuild(allocations[p.segment], p.offset, p.shape, p.strides, p.dtype)
                  for p in group.placements]
        self.stats.add("host_to_device", group.nbytes, time.perf_counter() - start)
        return {k: fill(sk, arrays) for k, sk in group.skeletons.items()}

    def _settle(self, group: SpilledGroup, values: dict) -> None:
        """Give the group's host buffers back and put its values in the device tier."""
        for i in group.live_segments():
            self.host.release(group.buffers[i])
        for k, value in values.items():
            self._insert(k, value, [self.codec.view(a) for a in leaves(value, self.codec.is_device)])

    def _restore(self, gid) -> None:
        self._make_room(self._groups[gid].nbytes)
        group = self._take_host_buffers(gid)
        for k in group.skeletons:
            del self._spilled[k]
        try:
            values = self._to_device(group)
        except BaseException:
            self._put_back(gid, group)
            raise
        self._settle(group, values)

    # --- prefetch and spill on demand

    def prefetch(self, keys: Iterable, headroom: float = 0.9) -> int:
        """Restore ``keys`` (soonest needed first) while they fit under ``headroom`` of the
        device limit without evicting anything needed sooner. Copies run outside the lock
        so reads of other keys go on meanwhile. Returns the bytes restored."""
        restored = 0
        for key in keys:
            with self._lock:
                gid = self._spilled.get(key)
                if gid is None:
                    continue
                n = self._groups[gid].nbytes
                if self._over_device(n) > -(1 - headroom) * self.device_limit:
                    break
                group = self._take_host_buffers(gid)
                event = threading.Event()
                for k in group.skeletons:
                    del self._spilled[k]
                    self._inflight[k] = event
            try:
                values = self._to_device(group)
            except BaseException:
                with self._lock:
                    for k in group.skeletons:
                        del self._inflight[k]
                    self._put_back(gid, group)
                event.set()
                raise
            with self._lock:
                self._settle(group, values)
                self.stats.prefetched_bytes += n
                for k in group.skeletons:
                    del self._inflight[k]
            event.set()
            restored += n
        return restored

    def evict_for(self, nbytes: int) -> int:
        """Spill device values that no running task reads until ``nbytes`` are freed (or
        none is left), whoever else refers to them: keys a client persisted, values waiting
        to be sent. Called when a device allocation fails; returns the device bytes freed
        (their allocations leave the store; the memory returns once any outside holder
        lets go), 0 when nothing could be (the allocation then fails as it would have)."""
        if getattr(self._local, "evicting", False):
            return 0  # an allocation inside our own eviction: let it fail
        self._local.evicting = True
        try:
            with self._lock:
                freed = 0
                for group in self._device_victims(exclude=()):
                    if freed >= nbytes:
                        break
                    try:
                        freed += self._device_to_host(group)
                    except Exception:  # no host buffer: keep what was freed so far
                        logger.exception("spill on demand could not copy %d keys to host", len(group))
                        break
                if freed:
                    self.stats.ondemand_events += 1
                    self.stats.ondemand_bytes += freed
                return freed
        finally:
            self._local.evicting = False

    def start(self) -> None:
        """Start what the store runs beside its worker, once: the worker plugin calls this
        when the worker has started (its CUDA context made by dask-cuda, which warns when
        one already exists), and the first spill does if no plugin did."""
        with self._lock:
            starting, self.on_start = self.on_start, []
        for begin in starting:
            begin()

    def close(self) -> None:
        self.host.close()  # stops the pinned arena's growth
        if self.disk is not None:
            self.disk.close()

