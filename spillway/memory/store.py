"""The worker's tiered store: device -> host -> disk (and any tier below).

A MutableMapping that a distributed Worker uses as its ``data``. Values live on the
device until the device tier passes its limit; then the values needed last move to host
buffers (slices of a pinned arena when there is one), and past the host limit to the
tier below it (the disk), and from a tier past its limit to the next. Reading a spilled
value restores it. What a tier is, and the names of the moves, are
:mod:`spillway.memory.tier`'s: the store holds its tiers fastest first
(:attr:`TieredStore.tiers`) and knows of none below the host but through that protocol. Three things make this faster than counting stored
outputs against a limit:

* **eviction by next use**: a ``rank`` callable (see :mod:`spillway.memory.policy`) says
  when each key is needed next by the tasks queued on the worker; keys nobody here waits
  for go first, then those needed last (:mod:`spillway.memory.eviction`);
* **prefetch**: :meth:`prefetch` restores the inputs of the next queued tasks on a
  background thread (copies outside the store's lock), so tasks find them on the device;
* **spill on demand**: :meth:`evict_for` frees device memory that no running task reads
  when an allocation fails (RMM calls it, see :mod:`spillway.launch.plugins`).

Where the tiers end: a spill disk that fills (``ENOSPC``) fails the write that needed the
room with :class:`~spillway.options.errors.SpillDiskFull`, one line naming the worker,
each tier's bytes and the spill directory; the values stay where they were and the file
begun is removed. The task that needed the room fails with that line, and
``on_disk_full`` (the worker plugin's: it tells the scheduler, whose capacity plugin stops
the computations running, :mod:`spillway.memory.capacity`) hears it.

The device tier is counted by allocation, not by value: keys whose values view one
allocation (slices, the arrays of a tuple that later keys also store) count it once and
move together (:mod:`spillway.memory.groups`, :mod:`spillway.memory.accounting`);
values inside tuples, lists and dicts are device values too.

The store only moves values through its ``codec`` (CuPy on GPUs, NumPy in CPU tests)
(:mod:`spillway.memory.moves`) and counts what it moved and how long it took in
:class:`~spillway.memory.stats.TierStats`.

:class:`TieredStore` owns the one lock: it alone takes it, and calls the accounting,
eviction and move helpers with it held (they take the state they act on and never lock).
Worker threads read and write keys, the prefetch thread restores keys, and RMM calls
:meth:`TieredStore.evict_for` from whichever thread's allocation failed.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Collection, Hashable, Iterable, MutableMapping, Sequence
from typing import Any

from spillway.options.errors import SpillDiskFull
from spillway.options.sizes import format_bytes
from . import eviction, moves
from .accounting import CleanCopies, DeviceTier, SpilledKeys
from .books import HostBooks
from .groups import leaves
from .host import HostBuffers, HostTier
from .stats import TierStats
from .tier import HOST, MOVES, SegmentTier, check_names, is_full, move_name, moves_of, raw_nbytes

__all__ = ["MOVES", "TierStats", "TieredStore"]

logger = logging.getLogger("spillway.memory")

GiB = 1 << 30
#: the host tier's room the drain keeps free for the next spills: room for
#: :data:`DRAIN_VALUES` of the largest group spilled so far, at least :data:`DRAIN_MIN`
#: bytes, at most an eighth of the host tier (what it writes early beyond what the
#: capacities force)
DRAIN_MIN = 2 * GiB
DRAIN_VALUES = 4
DRAIN_SHARE = 8
#: seconds between two looks of the drain when no spill wakes it (the machine's memory
#: may fall without one)
DRAIN_POLL_S = 0.5


class TieredStore(MutableMapping):
    def __init__(
        self,
        *,
        device_limit: int | None,
        host_limit: int | None,
        codec,
        below: Sequence[SegmentTier] = (),
        host: HostBuffers | None = None,
        rank: Callable[[Hashable], Any] | None = None,
        device_usage: Callable[[], int] | None = None,
        in_use: Callable[[], Collection] | None = None,
        books: HostBooks | None = None,
        drain: bool = False,
    ):
        self.codec = codec
        #: the host tier's buffers (the pinned arena, on-demand and pageable buffers)
        self.host = host or HostBuffers()
        # the limits are bytes; None: no limit
        self._device = DeviceTier(None if device_limit is None else int(device_limit), device_usage)
        self._host = HostTier(self.host, None if host_limit is None else int(host_limit))
        #: the tiers, fastest first: device, host, then ``below`` (the disk, ...)
        self.tiers = (self._device, self._host, *below)
        names = [t.name for t in self.tiers]
        check_names(names)
        #: key -> when it is needed next (smaller is sooner; None: not needed here)
        self.rank = rank
        #: keys that running tasks are reading: never moved (it would free nothing)
        self.in_use = in_use
        #: what the machine and the process really hold: every buffer that takes new host
        #: memory waits until both have room for it, values going to disk meanwhile,
        #: whatever else holds the machine's memory (other processes, the process's own)
        self.books = books
        self.host.before_new = self._room_for_new_host_memory
        self.host.has_room = self._room_ahead
        #: what the store starts once its worker has started (the pinned arena's growth:
        #: see :meth:`start`)
        self.on_start: list[Callable[[], Any]] = []
        #: the worker's name in messages (set by the worker plugin)
        self.name = "this worker"
        #: the line of the last write the disk had no room for (None once one succeeds)
        self.disk_full: str | None = None
        #: called with that line when the disk fills (at most once a second)
        self.on_disk_full: Callable[[str], Any] | None = None
        #: whether the last spill on demand stopped at a full disk
        self.evict_met_full_disk = False
        self._full_said_at = 0.0
        self.stats = TierStats.of(moves_of(names))
        device, host = names[:2]
        self._device.stats = self._host.stats = self.stats
        self._device.moves_in = self._host.moves_out = (move_name(host, device),)
        self._device.moves_out = self._host.moves_in = (move_name(device, host),)
        self._plain: dict = {}
        self._spilled = SpilledKeys(len(self.tiers))
        #: host copies of values read back and unchanged on the device (see CleanCopies)
        self._clean = CleanCopies()
        #: the one lock, held around every change of the tiers; reentrant: RMM calls
        #: evict_for from a device allocation made with it held (a restore's copies),
        #: and the first spill calls start
        self._lock = threading.RLock()
        self._inflight: dict = {}  # key -> event set when its prefetch is done
        self._local = threading.local()
        #: whether a background writer keeps the host tier's margin free (:meth:`drain`,
        #: started at the first spill); without it (tests of placement) the spills write
        #: for room themselves, as they still do whenever the drain falls behind
        self.drains = drain
        self._drain_thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._closing = threading.Event()
        #: bytes of host groups being written below by the drain (still counted in the
        #: host tier until they are in)
        self._draining = 0
        #: the largest group spilled so far (the drain's margin is sized from it)
        self._largest_spill = 0
        #: bytes of host values no task here waits for that the drain may still write below
        #: before the host tier fills (:meth:`write_ahead`)
        self._ahead = 0
        #: the most bytes of values held at once, every tier together, since the last
        #: :meth:`reset_peak`: what a run's capacities are read against (a bench's
        #: forced moves), where the tiers' counters say only what the store chose to move
        self.peak_bytes = 0

    @property
    def device_limit(self) -> int | None:
        return self._device.limit

    @device_limit.setter
    def device_limit(self, nbytes: int | None) -> None:
        self._device.limit = nbytes

    @property
    def host_limit(self) -> int | None:
        return self._host.limit

    @host_limit.setter
    def host_limit(self, nbytes: int | None) -> None:
        self._host.limit = nbytes

    @property
    def device_usage(self) -> Callable[[], int] | None:
        """Bytes really allocated on the device (RMM statistics), temporaries included."""
        return self._device.usage

    @device_usage.setter
    def device_usage(self, usage: Callable[[], int] | None) -> None:
        self._device.usage = usage

    @property
    def below(self) -> tuple:
        """The tiers below the host, fastest first."""
        return self.tiers[HOST + 1:]

    @property
    def device_bytes(self) -> int:
        """Bytes of the device allocations that stored values view."""
        return self._device.nbytes

    @property
    def host_bytes(self) -> int:
        """Bytes of the host buffers that spilled values are in."""
        return self._host.nbytes

    @property
    def held_bytes(self) -> int:
        """Bytes of the values every tier holds together (the disk's at their size, not
        compressed): what moves between tiers leave as it is."""
        return (self._device.nbytes + self._host.nbytes - self._clean.nbytes
                + sum(raw_nbytes(t) for t in self.tiers[HOST + 1:]))

    def reset_peak(self) -> int:
        """Start :attr:`peak_bytes` again from what is held now; returns that."""
        with self._lock:
            self.peak_bytes = self.held_bytes
            return self.peak_bytes

    @property
    def host_room(self) -> int | None:
        """Bytes the host tier can hold on this machine now: the host memory its buffers
        hold (the arena whole, used or not, and kept buffers) and what the machine has
        available past its headroom; None without the books. Less than the host limit
        where the process's own memory and other processes take their share: on the
        one-H100 host, 100 GiB against a limit of 111.3 GiB (an FFT past device and host
        wrote 18 GiB to disk where the limits said 5)."""
        books = self.books
        if books is None:
            return None
        return self.host.held_bytes + max(0, int(books.available()) - books.headroom)

    @property
    def below_bytes(self) -> int:
        """Bytes the tiers below the host hold (stored: compressed values at their size)."""
        return sum(t.nbytes for t in self.tiers[HOST + 1:])

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
                    value, views = self._device.compacted(value, self.codec)
                    # the keys already viewing this value's memory stay with it: moving
                    # them would free nothing
                    try:
                        self._make_room(self._device.new_bytes(views),
                                        exclude={key} | self._device.viewers(views))
                    except SpillDiskFull as e:
                        self._say_full(e)
                        raise
                    self._device.insert(key, value, views)
                    held = self.held_bytes
                    if held > self.peak_bytes:
                        self.peak_bytes = held
                    return
            event.wait()

    def __getitem__(self, key):
        while True:
            with self._lock:
                if key in self._device.stored:
                    self._device.stored.move_to_end(key)
                    return self._device.stored[key]
                if key in self._plain:
                    return self._plain[key]
                event = self._inflight.get(key)
                if event is None:
                    if key not in self._spilled:
                        raise KeyError(key)
                    start = time.perf_counter()
                    try:
                        self._restore(self._spilled.group_of[key])
                    except SpillDiskFull as e:
                        self._say_full(e)
                        raise
                    self.stats.wait_s += time.perf_counter() - start
                    return self._device.stored[key]
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
            return iter(list(self._device.stored) + list(self._plain) + list(self._spilled.group_of)
                        + list(self._inflight))

    def __len__(self) -> int:
        return len(self._device) + len(self._plain) + len(self._spilled) + len(self._inflight)

    # --- where things are

    def tier_of(self, key) -> str | None:
        """The name of the tier ``key`` is in; "plain" for a value that is no device
        value (it stays where it is), "moving" while a prefetch brings it back."""
        if key in self._device:
            return self._device.name
        if key in self._plain:
            return "plain"
        level = self._spilled.tier_of(key)
        if level is not None:
            return self.tiers[level].name
        if key in self._inflight:
            return "moving"
        return None

    def in_memory(self, key) -> bool:
        """Whether ``key``'s value is at hand, not spilled: on the device, or a plain value."""
        return key in self._device or key in self._plain

    def spilled(self, keys: Iterable) -> list:
        """The keys among ``keys`` whose values are in a tier below the device."""
        spilled = self._spilled
        return [k for k in keys if k in spilled]

    def summary(self) -> dict:
        """The tiers' bytes and keys; ``disk_*``: the tiers below the host together."""
        counts = self._spilled.key_counts()
        below = self.tiers[HOST + 1:]
        return {
            "device_bytes": self.device_bytes,
            "host_bytes": self.host_bytes,
            "disk_bytes": sum(t.nbytes for t in below),
            "disk_raw_bytes": sum(raw_nbytes(t) for t in below),
            "disk_full": self.disk_full,
            "held_bytes": self.held_bytes,
            "host_clean_bytes": self._clean.nbytes,
            "peak_bytes": self.peak_bytes,
            "device_keys": len(self._device),
            "device_buffers": len(self._device.allocations),
            "host_keys": counts[HOST],
            "disk_keys": sum(counts[HOST + 1:]),
            "tiers": {t.name: {"bytes": t.nbytes, "keys": len(self._device) if not level else counts[level],
                               "limit": t.limit} for level, t in enumerate(self.tiers)},
            "host_pinned_on_demand_bytes": self.host.pinned_bytes,
            "host_pageable_total": self.host.pageable_total,
            "host": self.host.summary(),
            "books": self.books.summary(self.host.held_bytes) if self.books is not None else None,
            "stats": self.stats.to_json(),
        }

    def exhausted(self, nbytes: int) -> str:
        """One line for a device allocation that nothing more could make room for."""
        with self._lock:
            running = eviction.running(self.in_use)
            in_use = self._device.held_bytes(running)
            disk = self.below_bytes
            held = _held_by_layer(self._device, running)
            return (f"{self.name}: cannot allocate {format_bytes(nbytes)} on the device and nothing "
                    f"more can be spilled: device {format_bytes(self.device_bytes)} stored "
                    f"({format_bytes(in_use)} in use by running tasks) of "
                    f"{_limit(self.device_limit)}, host {format_bytes(self.host_bytes)}, "
                    f"disk {format_bytes(disk)}{held}; use smaller chunks or more workers")

    # --- the tiers' changes (callers hold the lock)

    def _means(self) -> moves.Means:
        return moves.Means(self.codec, self.tiers, self.stats)

    def _remove(self, key) -> None:
        gid = self._clean.gid_of.get(key)
        if gid is not None:  # the value changes or goes: its host copy is none of its own
            self._drop_clean(gid)
        if key in self._device:
            shared = self._device.remove(key)
            if shared:
                self._device.recompact(shared, self.codec, stay=eviction.running(self.in_use))
        elif key in self._plain:
            del self._plain[key]
        elif key in self._spilled:
            moves.drop(self._spilled, key, self._means())

    def _over_device(self, incoming: int) -> int:
        """Bytes to free on the device before ``incoming`` more bytes fit."""
        device = self._device
        return eviction.over_device(device.nbytes, incoming, device.limit, device.usage)

    def _device_victims(self, exclude) -> list[list]:
        """Groups of device keys in eviction order, but for ``exclude`` and the keys
        running tasks read (see :func:`eviction.device_victims`)."""
        return eviction.device_victims(self._device, set(exclude) | eviction.running(self.in_use), self.rank)

    def _make_room(self, incoming: int, exclude=()) -> None:
        need = self._over_device(incoming)
        if need <= 0:
            return
        for group in self._device_victims(exclude):
            if need <= 0:
                break
            need -= self._device_to_host(group)

    def _device_to_host(self, keys: list) -> int:
        """Copy the keys of one group to host buffers; returns the device bytes freed."""
        if self.on_start:
            self.start()
        gid = self._clean.matching(keys)
        if gid is not None:
            return self._spill_clean(gid, keys)
        for k in keys:  # leaving in another group: a clean copy of part of it is stale
            stale = self._clean.gid_of.get(k)
            if stale is not None:
                self._drop_clean(stale)
        freed = moves.device_to_host(self._device, self._spilled, keys, self._means(), self._spill_host)
        if freed > self._largest_spill:
            self._largest_spill = freed
        self._wake_drain()
        return freed

    # --- clean copies: what was read back from the host and did not change

    def _keep_clean(self, gid, group) -> bool:
        """Keep a restored group's host buffers as a clean copy where the host tier has
        room for them as it is (keeping one never moves another value down); False: the
        caller gives them back."""
        host = self._host
        if host.limit is not None and host.nbytes - self._draining + group.nbytes > host.limit:
            return False
        moves.keep_on_host(gid, group, self._means())
        self._clean.add(gid, group)
        return True

    def _spill_clean(self, gid, keys: list) -> int:
        """Spill keys whose host copy was kept: the device lets them go, the host tier
        has them already (nothing is copied); returns the device bytes freed."""
        group = self._clean.pop(gid)
        before = self._device.nbytes
        for k in keys:
            self._device.remove(k)
        self._spilled.put_back(gid, group)
        self.stats.clean_bytes += group.nbytes
        return before - self._device.nbytes

    def _drop_clean(self, gid) -> int:
        """Give back a clean copy's host buffers (its values stay on the device)."""
        group = self._clean.pop(gid)
        for i in group.live_segments():
            self._host.delete((gid, i))
        return group.nbytes

    def _drop_cleans(self, need: int) -> int:
        """Give back clean copies until ``need`` bytes are (or none is left), those of the
        values needed soonest first (the least likely to be spilled again); returns the
        bytes given back."""
        if need <= 0 or not self._clean.groups:
            return 0
        groups = self._clean.groups
        order = eviction.ordered(list(groups), self.rank, keys_of=lambda g: groups[g].skeletons)
        freed = 0
        for gid in reversed(order):
            if freed >= need:
                break
            freed += self._drop_clean(gid)
        return freed

    # --- the drain: disk writes off the spills' path

    @property
    def drain_margin(self) -> int:
        """Bytes of the host tier the drain keeps free (0: no host limit)."""
        limit = self._host.limit
        if limit is None:
            return 0
        return min(limit // DRAIN_SHARE, max(DRAIN_MIN, DRAIN_VALUES * self._largest_spill))

    def write_ahead(self, nbytes: int) -> None:
        """Let the drain write up to ``nbytes`` of host values that no task waits for to
        the tier below before the host tier fills: the scheduler admitted a graph that
        goes past this worker's device and host by that much (:mod:`.capacity`), so those
        bytes go to disk whatever the order. Written while the host tier fills, the disk's
        time hides behind the spills' instead of following them (an FFT past one H100's
        device and host ran its last half at the disk's rate, writing what it must only
        once the host was full).

        ``nbytes`` of 0 ends it: the scheduler's admitted graphs are all in memory. What
        was not written by then is not written: the next graph's inputs, held on the host
        before a task of it asks for them, are needed by no task yet (on one H100 a
        budget left from one FFT wrote the next one's inputs to disk, 18 GB read back)."""
        with self._lock:
            if nbytes <= 0:
                self._ahead = 0
                return
            self._ahead = max(self._ahead, int(nbytes))
            self.stats.ahead_said_bytes += int(nbytes)
            self._wake_drain()

    @property
    def ahead_bytes(self) -> int:
        """Bytes the drain may still write ahead (:meth:`write_ahead`)."""
        return self._ahead

    def _unneeded_on_host(self):
        """The oldest host group that no task waits for (the first in eviction order), or
        None; found without ordering the whole tier."""
        groups = self._spilled.groups
        for gid in self._spilled.resident[HOST]:
            if eviction.rank_of(self.rank, groups[gid].skeletons) is None:
                return gid
        return None

    def _wants_drain(self) -> bool:
        """Whether the next spills would find no room in the host tier (its margin not
        free under its limit), or find the machine short of the memory a new buffer takes
        while the arena has no slice for the largest spill yet (a slice of the whole
        margin may never come free in a fragmented arena: waiting for one would write down
        far more than the next spill needs). The caller holds the lock."""
        if len(self.tiers) == HOST + 1 or not self._spilled.on_host:
            return False
        return self._short_of_margin() or self._writes_ahead()

    def _short_of_margin(self) -> bool:
        margin = self.drain_margin
        host = self._host
        if host.limit is not None and host.nbytes - self._draining + margin > host.limit:
            return True
        books = self.books
        return (books is not None and margin > 0 and not self.host.arena_fits(max(1, self._largest_spill))
                and books.short_by(margin, count=False) > 0)

    def _writes_ahead(self) -> bool:
        return self._ahead > 0 and self._unneeded_on_host() is not None

    def drain(self) -> int:
        """Write the host groups needed last to the tier below while :meth:`_wants_drain`,
        each outside the lock (its keys in flight: a read of one waits for the write), so
        that spills find their room in host memory at once and never wait on the disk.
        Returns the bytes written. A write that fails puts its group back on the host."""
        written = 0
        while not self._closing.is_set():
            with self._lock:
                if len(self.tiers) == HOST + 1 or not self._spilled.on_host:
                    return written
                if self._short_of_margin():
                    if self._clean.groups:  # room that costs no write
                        self._drop_cleans(1)
                        continue
                    order = self._order(HOST)
                    if not order:
                        return written
                    gid = order[0]
                elif self._ahead > 0:
                    gid = self._unneeded_on_host()
                    if gid is None:
                        return written
                else:
                    return written
                group = moves.take_to_lower(self._spilled, gid)
                nbytes = group.nbytes
                event = threading.Event()
                for k in group.skeletons:
                    self._inflight[k] = event
                self._draining += nbytes
            try:
                if HOST + 2 < len(self.tiers):
                    with self._lock:  # a tier below the disk: room there first
                        self._room_in(HOST + 1, nbytes)
                seconds = moves.write_down(group, gid, self._means())
            except BaseException as e:
                with self._lock:
                    self._spilled.put_back(gid, group)
                    for k in group.skeletons:
                        del self._inflight[k]
                    self._draining -= nbytes
                event.set()
                if isinstance(e, SpillDiskFull) or is_full(e):
                    return written  # the spills meet the full disk themselves, and say so
                raise
            with self._lock:
                moves.settle_lowered(self._spilled, gid, group, self._means(), seconds)
                if eviction.rank_of(self.rank, group.skeletons) is not None:
                    self.stats.needed_written_bytes += nbytes
                for k in group.skeletons:
                    del self._inflight[k]
                self._draining -= nbytes
                self._ahead = max(0, self._ahead - nbytes)
                self.stats.drained_bytes += nbytes
                if self.disk_full is not None:
                    self.disk_full = None
            event.set()
            written += nbytes
        return written

    def _wake_drain(self) -> None:
        """Wake the drain (start it at the first spill); the caller holds the lock."""
        if not self.drains or len(self.tiers) == HOST + 1 or self._closing.is_set():
            return
        if self._drain_thread is None:
            self._drain_thread = threading.Thread(target=self._drain_loop, name="spillway-drain", daemon=True)
            self._drain_thread.start()
        self._wake.set()

    def _drain_loop(self) -> None:
        while not self._closing.is_set():
            self._wake.wait(DRAIN_POLL_S)
            self._wake.clear()
            try:
                self.drain()
            except Exception:  # never take the worker down: the spills still make room themselves
                logger.exception("%s: the host tier's drain to disk failed; spills write for room themselves",
                                 self.name)
                self._closing.wait(1.0)

    def _spill_host(self, incoming: int) -> None:
        """Move host groups down until ``incoming`` more bytes fit under the host limit
        (or the host tier is empty: a group larger than the limit still goes to host).
        The machine's own room is checked buffer by buffer (:meth:`_room_for_new_host_memory`)."""
        self._room_in(HOST, incoming)

    def _room_in(self, level: int, incoming: int) -> None:
        """Move groups of the tier at ``level`` to the one below until ``incoming`` more
        bytes fit under its limit (nothing where it has none, or no tier below it)."""
        tier = self.tiers[level]
        # the host groups the drain is writing below are as good as gone: their buffers
        # go back the moment their writes end (counting them would write more for them)
        held = tier.nbytes - (self._draining if level == HOST else 0)
        need = eviction.over_limit(held, incoming, tier.limit)
        if level == HOST:  # clean copies go first: dropping one moves nothing
            need -= self._drop_cleans(need)
        if need <= 0 or level + 1 == len(self.tiers):
            return
        try:
            self._lower(level, self._order(level), need)
        except SpillDiskFull:
            # the tier below is full: a little past this tier's limit (what the machine
            # has room for is still checked buffer by buffer) rather than fail a small value
            if tier.nbytes + incoming > tier.limit + host_slack(tier.limit):
                raise

    def _lower(self, level: int, order: list, need: int, *, for_room: bool = False) -> None:
        """Move groups of the tier at ``level`` to the tier below (:func:`moves.lower`),
        each after room is made there where it has a tier below it too; a tier with no
        room left raises :class:`SpillDiskFull` with the tiers' line. ``for_room``: the
        host's writes are for the machine's memory, not the host tier's limit (counted
        apart in the stats)."""
        room = functools.partial(self._room_in, level + 1) if level + 2 < len(self.tiers) else None
        resident = self._spilled.resident[level]
        try:
            moves.lower(self._spilled, level, order, need, self._means(), room)
        except OSError as e:
            if not is_full(e):
                raise
            raise self._full(e, need, level) from None
        finally:
            if level == HOST:
                self._count_written([g for g in order if g not in resident], for_room)
        if self.disk_full is not None:
            self.disk_full = None

    def _count_written(self, gids: list, for_room: bool) -> None:
        """Count host groups just written below by why they went, and those a task here
        still waits for (each such byte is read back: what the order could not spare)."""
        stats, groups = self.stats, self._spilled.groups
        for gid in gids:
            group = groups.get(gid)
            if group is None:
                continue
            if for_room:
                stats.room_written_bytes += group.nbytes
            else:
                stats.limit_written_bytes += group.nbytes
            if eviction.rank_of(self.rank, group.skeletons) is not None:
                stats.needed_written_bytes += group.nbytes

    def _full(self, error: OSError, need: int, level: int) -> SpillDiskFull:
        source, tier = self.tiers[level], self.tiers[level + 1]
        try:
            room = tier.room()
            free = "unknown" if room is None else format_bytes(room)
        except OSError:
            free = "unknown"
        below = []
        for t in self.tiers[HOST + 1:]:
            raw = raw_nbytes(t)
            compressed = f" ({format_bytes(raw)} of values)" if raw != t.nbytes else ""
            below.append(f"{t.name} {format_bytes(t.nbytes)} written{compressed}")
        line = (f"{self.name}: the spill {tier.name} is full ({error.strerror or error}) writing "
                f"{format_bytes(max(need, 0))} of its {source.name} tier to {tier.where} ({free} free): "
                f"device {format_bytes(self.device_bytes)} of {_limit(self.device_limit)}, host tier "
                f"{format_bytes(self.host_bytes)} of {_limit(self.host_limit)}, {', '.join(below)}; "
                f"past what {' + '.join(t.name for t in self.tiers)} hold: "
                f"release held arrays or give the workers a larger local-directory")
        self.disk_full = line
        return SpillDiskFull(line)

    def _say_full(self, error: SpillDiskFull) -> None:
        """Tell ``on_disk_full`` of a full disk that stopped a read, a write or a relief
        (not of one the store found its way around), at most once a second."""
        now = time.monotonic()
        if self.on_disk_full is not None and now - self._full_said_at >= 1.0:
            self._full_said_at = now
            try:
                self.on_disk_full(str(error))
            except Exception:  # telling the scheduler is a nicety: the task fails anyway
                logger.debug("on_disk_full failed", exc_info=True)

    def _order(self, level: int) -> list:
        """The groups of the tier at ``level`` in the order they leave it."""
        groups = self._spilled.groups
        return eviction.ordered(list(self._spilled.resident[level]), self.rank, keys_of=lambda g: groups[g].skeletons)

    def _room_for_new_host_memory(self, nbytes: int) -> None:
        """Before a host buffer takes ``nbytes`` of new memory (HostBuffers calls this,
        with the lock held): while the machine would fall under its headroom or the
        process over its limit, give back cached pinned blocks, then write host groups
        to disk, each freeing its buffers (or arena slices the buffer can take)."""
        books = self.books
        if books is None or books.short_by(nbytes) <= 0 or len(self.tiers) == HOST + 1:
            return
        if self._write_host_while(nbytes) and books.short_by(nbytes, count=False) > 0:
            logger.warning("%s: the host is short of memory for a %s buffer and the host tier holds "
                           "nothing more to write to disk (%s)", self.name, format_bytes(nbytes),
                           books.pressure(paused=False) or "the process holds it outside the store")

    def _room_ahead(self, nbytes: int) -> bool:
        """Whether a buffer of ``nbytes`` touched ahead of the spills fits the machine
        beside the drain's margin: one that took the margin would make the drain write
        values to disk for a buffer that no spill may ever take."""
        books = self.books
        return books is None or books.short_by(nbytes + self.drain_margin, count=False) <= 0

    def relieve_host(self) -> int:
        """Write host groups to disk while the machine is under its headroom or the
        process over its limit (the worker plugin calls this while the worker is paused
        for memory); returns the bytes written."""
        if self.books is None or len(self.tiers) == HOST + 1:
            return 0
        with self._lock:
            before = self._host.nbytes
            try:
                self._write_host_while(0)
            except SpillDiskFull as e:
                self._say_full(e)
                raise
            return before - self._host.nbytes

    def _write_host_while(self, nbytes: int) -> bool:
        """Give back cached pinned blocks and kept pageable buffers, then write host groups
        to disk, in eviction order, until ``nbytes`` more host memory fit the books (or a
        slice of the arena); True when the host tier ran out first. The caller holds the
        lock."""
        def room() -> bool:
            self.host.give_back()
            return (nbytes and self.host.arena_fits(nbytes)) or self.books.short_by(nbytes, count=False) <= 0

        if room():
            return False
        while self._clean.groups:
            self._drop_cleans(1)
            if room():
                return False
        for gid in self._order(HOST):
            self._lower(HOST, [gid], 1, for_room=True)
            if room():
                return False
        return True

    def _restore(self, gid) -> None:
        try:
            moves.restore(self._device, self._spilled, gid, self._means(), self._make_room, keep=self._keep_clean)
        except SpillDiskFull:
            group = self._spilled.groups.get(gid)
            if group is None or group.tier == HOST:
                raise
            # every tier full: the room the device's values need below is the room this
            # group's files hold, so read it off the disk first
            try:
                moves.restore(self._device, self._spilled, gid, self._means(), self._make_room, read_first=True)
            except SpillDiskFull:
                if gid in self._spilled.on_host:  # back to the room its files left
                    try:
                        self._lower(HOST, [gid], 1)
                    except SpillDiskFull:
                        pass
                raise

    # --- prefetch and spill on demand

    def prefetch(self, keys: Iterable, headroom: float = 0.9) -> int:
        """Restore ``keys`` (soonest needed first) while they fit under ``headroom`` of the
        device limit without evicting anything needed sooner. Copies run outside the lock
        so reads of other keys go on meanwhile. Returns the bytes restored."""
        restored = 0
        for key in keys:
            with self._lock:
                gid = self._spilled.group_of.get(key)
                if gid is None:
                    continue
                n = self._spilled.groups[gid].nbytes
                if self.device_limit is not None and self._over_device(n) > -(1 - headroom) * self.device_limit:
                    break
                try:
                    group = moves.take_host_buffers(self._spilled, gid, self._means())
                except SpillDiskFull:  # no room to read it back into: tasks will say so
                    break
                event = threading.Event()
                for k in group.skeletons:
                    del self._spilled.group_of[k]
                    self._inflight[k] = event
            try:
                values = moves.to_device(group, self._means())
            except BaseException:
                with self._lock:
                    for k in group.skeletons:
                        del self._inflight[k]
                    moves.put_back(self._spilled, gid, group, self._means())
                event.set()
                raise
            with self._lock:
                moves.settle(self._device, group, values, self._means(), functools.partial(self._keep_clean, gid))
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
        self.evict_met_full_disk = False
        try:
            with self._lock:
                freed = 0
                for group in self._device_victims(exclude=()):
                    if freed >= nbytes:
                        break
                    try:
                        freed += self._device_to_host(group)
                    except SpillDiskFull:  # the allocation fails with the disk's line
                        self.evict_met_full_disk = True
                        break
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
        self._closing.set()
        self._wake.set()
        drain = self._drain_thread
        if drain is not None and drain is not threading.current_thread():
            drain.join(10.0)  # a write under way ends before its tier closes
        for tier in self.tiers[HOST:]:
            tier.close()  # the host's stops the pinned arena's growth


def host_slack(limit: int) -> int:
    """Bytes a tier (the host's) may hold past its limit while the tier below is full: a
    thirty-second of it, at most 1 GiB."""
    return min(limit // 32, 1 << 30)


def _limit(nbytes: int | None) -> str:
    return "no limit" if nbytes is None else f"a {format_bytes(nbytes)} limit"


def _held_by_layer(device, keys) -> str:
    """The largest holders among ``keys``, by the name of their layer (``; running tasks
    read 104 x getitem-q1 (77.4 GiB)``), or nothing when they hold nothing."""
    from dask.utils import key_split

    layers: dict[str, list] = {}
    for key in keys:
        if key in device.holds:
            entry = layers.setdefault(key_split(key), [0, 0])
            entry[0] += 1
            entry[1] += device.held_bytes([key])
    top = sorted(layers.items(), key=lambda item: -item[1][1])[:3]
    if not top or not top[0][1][1]:
        return ""
    return "; running tasks read " + ", ".join(f"{n} x {name} ({format_bytes(b)})" for name, (n, b) in top)
