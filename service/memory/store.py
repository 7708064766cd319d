"""The worker's tiered store: device -> host -> disk.

A MutableMapping that a distributed Worker uses as its ``data``. Values live on the
device until the device tier passes its limit; then the values needed last move to host
buffers (slices of a pinned arena when there is one), and past the host limit to disk.
Reading a spilled value restores it. Three things make this faster than counting stored
outputs against a limit:

* **eviction by next use**: a ``rank`` callable (see :mod:`service.memory.policy`) says
  when each key is needed next by the tasks queued on the worker; keys nobody here waits
  for go first, then those needed last;
* **prefetch**: :meth:`prefetch` restores the inputs of the next queued tasks on a
  background thread (copies outside the store's lock), so tasks find them on the device;
* **spill on demand**: :meth:`evict_for` frees device memory that no running task holds
  when an allocation fails (RMM calls it, see :mod:`service.memory.ondemand`).

The store only moves values through its ``codec`` (CuPy on GPUs, NumPy in CPU tests) and
counts what it moved and how long it took in :class:`TierStats`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dask.sizeof import sizeof

from .arena import Arena
from .codecs import HostCopy
from .disk import DiskTier
from .host import HostBuffers

logger = logging.getLogger("spillway.memory")

MOVES = ("device_to_host", "host_to_device", "host_to_disk", "disk_to_host")


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
        self.stats = TierStats()
        self._device: OrderedDict = OrderedDict()
        self._host: OrderedDict = OrderedDict()
        self._plain: dict = {}
        self._sizes: dict = {}
        self.device_bytes = 0
        self.host_bytes = 0
        self._lock = threading.RLock()
        self._inflight: dict = {}
        self._local = threading.local()

    # --- MutableMapping

    def __setitem__(self, key, value) -> None:
        with self._lock:
            if key in self:
                self._remove(key)
            if self.codec.is_device(value):
                n = self.codec.nbytes(value)
                self._make_room(n, exclude={key})
                self._device[key] = value
                self._sizes[key] = n
                self.device_bytes += n
            else:
                self._plain[key] = value
                self._sizes[key] = sizeof(value)

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
                    if key not in self._host and not (self.disk is not None and key in self.disk):
                        raise KeyError(key)
                    start = time.perf_counter()
                    value = self._restore(key)
                    self.stats.wait_s += time.perf_counter() - start
                    return value
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
        return (
            key in self._device
            or key in self._plain
            or key in self._host
            or key in self._inflight
            or (self.disk is not None and key in self.disk)
        )

    def __iter__(self):
        keys = list(self._device) + list(self._plain) + list(self._host) + list(self._inflight)
        if self.disk is not None:
            keys += list(self.disk.meta)
        return iter(keys)

    def __len__(self) -> int:
        return len(self._device) + len(self._plain) + len(self._host) + len(self._inflight) + (
            len(self.disk.meta) if self.disk is not None else 0
        )

    # --- where things are

    def tier_of(self, key) -> str | None:
        if key in self._device:
            return "device"
        if key in self._plain:
            return "plain"
        if key in self._host:
            return "host"
        if self.disk is not None and key in self.disk:
            return "disk"
        if key in self._inflight:
            return "moving"
        return None

    def summary(self) -> dict:
        return {
            "device_bytes": self.device_bytes,
            "host_bytes": self.host_bytes,
            "disk_bytes": self.disk.nbytes if self.disk is not None else 0,
            "device_keys": len(self._device),
            "host_keys": len(self._host),
            "disk_keys": len(self.disk.meta) if self.disk is not None else 0,
            "host_pinned_on_demand_bytes": self.host.pinned_bytes,
            "host_pageable_total": self.host.pageable_total,
            "stats": self.stats.to_json(),
        }

    # --- moves (callers hold the lock)

    def _remove(self, key) -> None:
        n = self._sizes.pop(key, 0)
        if key in self._device:
            del self._device[key]
            self.device_bytes -= n
        elif key in self._plain:
            del self._plain[key]
        elif key in self._host:
            self.host.release(self._host.pop(key).buffer)
            self.host_bytes -= n
        elif self.disk is not None and key in self.disk:
            self.disk.delete(key)

    def _victims(self, keys: Iterable, exclude) -> list:
        """Keys in eviction order: not needed here first (least recently used first),
        then those needed last."""
        unused, ranked = [], []
        for order, key in enumerate(keys):
            if key in exclude:
                continue
            r = self.rank(key) if self.rank is not None else None
            if r is None:
                unused.append(key)
            else:
                ranked.append((r, order, key))
        ranked.sort(reverse=True)
        return unused + [key for _, _, key in ranked]

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
        for key in self._victims(list(self._device), exclude):
            if need <= 0:
                break
            need -= self._device_to_host(key)

    def _device_to_host(self, key) -> int:
        n = self._sizes[key]
        # Free the host tier first: with the host tier at its limit the pinned arena
        # (sized to that limit) is full, and the copy would land in a buffer pinned on
        # demand (a slow first allocation, and pinned memory beyond the arena).
        self._spill_host(n)
        value = self._device[key]
        waited = time.perf_counter()
        # On a busy GPU the value may still be being computed; the copy cannot start
        # before it is, and that wait is compute, not spilling.
        self.codec.ready(value)
        start = time.perf_counter()
        self.stats.producer_wait_s += start - waited
        copy = self.codec.to_host(value, self.host.alloc)  # if it fails, the value stays
        self.stats.add("device_to_host", n, time.perf_counter() - start)
        del value, self._device[key]
        self.device_bytes -= n
        self._host[key] = copy
        self.host_bytes += n
        return n

    def _spill_host(self, incoming: int) -> None:
        """Write host copies to disk until ``incoming`` more bytes fit under the host limit
        (or the host tier is empty: a value larger than the limit still goes to host)."""
        need = self.host_bytes + incoming - self.host_limit
        if need <= 0 or self.disk is None:
            return
        for key in self._victims(list(self._host), exclude=()):
            if need <= 0:
                break
            copy = self._host.pop(key)
            start = time.perf_counter()
            self.disk.write(key, copy)
            self.stats.add("host_to_disk", copy.nbytes, time.perf_counter() - start)
            self.host.release(copy.buffer)
            self.host_bytes -= copy.nbytes
            need -= copy.nbytes

    def _take_host_copy(self, key) -> HostCopy:
        """Remove ``key``'s host copy from the host or disk tier (caller holds the lock)."""
        if key in self._host:
            copy = self._host.pop(key)
            self.host_bytes -= copy.nbytes
            return copy
        start = time.perf_counter()
        copy = self.disk.read(key, self.host.alloc)
        self.stats.add("disk_to_host", copy.nbytes, time.perf_counter() - start)
        self.disk.delete(key)
        return copy

    def _restore(self, key):
        n = self._sizes[key]
        self._make_room(n, exclude={key})
        copy = self._take_host_copy(key)
        start = time.perf_counter()
        try:
            value = self.codec.to_device(copy)
        except BaseException:
            self._host[key] = copy  # nothing lost: the host copy stays
            self.host_bytes += copy.nbytes
            raise
        self.stats.add("host_to_device", n, time.perf_counter() - start)
        self.host.release(copy.buffer)
        self._device[key] = value
        self.device_bytes += n
        return value

    # --- prefetch and spill on demand

    def prefetch(self, keys: Iterable, headroom: float = 0.9) -> int:
        """Restore ``keys`` (soonest needed first) while they fit under ``headroom`` of the
        device limit without evicting anything needed sooner. Copies run outside the lock
        so reads of other keys go on meanwhile. Returns the bytes restored."""
        restored = 0
        for key in keys:
            with self._lock:
                if key not in self._host and not (self.disk is not None and key in self.disk):
                    continue
                n = self._sizes[key]
                if self._over_device(n) > -(1 - headroom) * self.device_limit:
                    break
                copy = self._take_host_copy(key)
                event = self._inflight[key] = threading.Event()
            try:
                start = time.perf_counter()
                value = self.codec.to_device(copy)
                seconds = time.perf_counter() - start
            except BaseException:
                with self._lock:
                    self._host[key] = copy
                    self.host_bytes += copy.nbytes
                    del self._inflight[key]
                event.set()
                raise
            with self._lock:
                self.host.release(copy.buffer)
                self._device[key] = value
                self.device_bytes += n
                self.stats.add("host_to_device", n, seconds)
                self.stats.prefetched_bytes += n
                del self._inflight[key]
            event.set()
            restored += n
        return restored

    def evict_for(self, nbytes: int) -> int:
        """Spill device values that nothing outside the store holds until ``nbytes`` are
        freed (or none is left). Called when a device allocation fails; returns the bytes
        freed, 0 when nothing could be (the allocation then fails as it would have)."""
        if getattr(self._local, "evicting", False):
            return 0  # an allocation inside our own eviction: let it fail
        self._local.evicting = True
        try:
            with self._lock:
                freed = 0
                for key in self._victims(list(self._device), exclude=()):
                    if freed >= nbytes:
                        break
                    # three references: the dict, the getrefcount argument and `value`
                    value = self._device[key]
                    held = sys.getrefcount(value) > 3
                    del value
                    if held:
                        continue
                    freed += self._device_to_host(key)
                if freed:
                    self.stats.ondemand_events += 1
                    self.stats.ondemand_bytes += freed
                return freed
        finally:
            self._local.evicting = False

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()
