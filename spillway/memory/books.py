"""What the worker process and its machine really hold, beside the store's own books.

The tiered store counts its host tier by the buffers it hands out, but the kernel's
out-of-memory killer counts pages: the process's anonymous and shared resident memory
(CUDA's pinned allocations are shared mappings), whoever took them. On the H100 host a
108 GB SVD ran the machine out of memory with the store's books well inside their
limit: buffers pinned on demand and cached by CuPy's pinned pool, pageable buffers past
the arena and the process's own memory came on top of the host tier, and a test that
thought a fragmented arena had room skipped the check of the machine altogether.

So every new host buffer the store takes (a spill past the arena, a read back from disk)
asks :meth:`HostBooks.short_by` first, which reads the machine's available memory and the
process's resident bytes at that moment; the store writes host values to disk until
both have room. The same readings decide when the worker stops starting tasks
(:meth:`HostBooks.pressure`, used by the worker plugin): values the store never sees (a
task's host temporaries, incoming transfers) also fill the host.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from spillway.options.sizes import format_bytes

#: the worker pauses when the machine's available memory falls under this share of the
#: headroom the store keeps, and resumes once the whole headroom is back
PAUSE_SHARE = 0.5
#: growth past a process floor (:meth:`HostBooks.pressure`) that pauses the worker again
FLOOR_MARGIN = 256 * 2**20


def process_resident() -> int:
    """Bytes this process holds in RAM that only it can give back: its anonymous and
    shared (pinned CUDA allocations, shared memory) resident pages, not file pages the
    kernel can drop."""
    try:
        anon = shmem = 0
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    anon = int(line.split()[1]) << 10
                elif line.startswith("RssShmem:"):
                    shmem = int(line.split()[1]) << 10
        return anon + shmem
    except OSError:  # not Linux: the whole resident set
        import psutil

        return int(psutil.Process().memory_info().rss)


@dataclass
class HostBooks:
    """The host limits that hold whatever the books say: the machine keeps ``headroom``
    bytes available, and the process holds at most ``process_limit`` bytes (None: no
    limit of its own, the machine's bound alone)."""

    #: bytes the machine (or the process's cgroup) has available now
    available: Callable[[], int]
    headroom: int = 0
    process_limit: int | None = None
    resident: Callable[[], int] = process_resident
    #: the lowest available bytes seen by any check (the process's peak is distributed's
    #: monitor's, sampled whether the store checks or not)
    lowest_available: int | None = field(default=None, init=False)
    #: checks that found the host short, and when the last one did
    short_events: int = field(default=0, init=False)
    #: whether the last :meth:`pressure` that found a reason found the process limit's
    over_process_limit: bool = field(default=False, init=False)
    #: the process's resident bytes at the last reading
    last_resident: int = field(default=0, init=False)
    last_short_at: float | None = field(default=None, init=False)

    def read(self) -> tuple[int, int]:
        """(available, resident) now; the lowest available is kept."""
        available = int(self.available())
        resident = self.last_resident = int(self.resident())
        if self.lowest_available is None or available < self.lowest_available:
            self.lowest_available = available
        return available, resident

    def short_by(self, nbytes: int, *, count: bool = True) -> int:
        """Bytes to give back before ``nbytes`` more host memory may be taken (0 or less:
        none); ``count`` tallies a shortfall in :attr:`short_events`."""
        available, resident = self.read()
        short = nbytes + self.headroom - available
        if self.process_limit is not None:
            short = max(short, resident + nbytes - self.process_limit)
        if short > 0 and count:
            self.short_events += 1
            self.last_short_at = time.time()
        return short

    def pressure(self, paused: bool, process_floor: int | None = None) -> str | None:
        """Why the worker should not start tasks now (None: it may). A paused worker
        resumes only once the whole headroom is back, so it does not flap.
        ``process_floor``: resident bytes found to be the process's own (nothing of the
        store's left to give back), over which the process limit is read instead of
        under it. :attr:`over_process_limit` tells which of the two limits spoke."""
        available, resident = self.read()
        self.over_process_limit = False
        share = 1.0 if paused else PAUSE_SHARE
        if available < share * self.headroom:
            return (f"the machine has {format_bytes(available)} available, under "
                    f"{format_bytes(int(share * self.headroom))}")
        if self.process_limit is not None:
            limit = self.process_limit - (self.headroom * (1 - share) if paused else 0)
            if process_floor is not None:
                limit = max(limit, self.floor_limit(process_floor))
            if resident > limit:
                self.over_process_limit = True
                return (f"the worker holds {format_bytes(resident)}, over its "
                        f"{format_bytes(self.process_limit)} memory limit")
        return None

    def floor_limit(self, process_floor: int) -> int:
        """Resident bytes past which a process found to hold ``process_floor`` of its own
        pauses again: what it held, and 5% of its limit (at least :data:`FLOOR_MARGIN`)."""
        return process_floor + max(FLOOR_MARGIN, self.process_limit // 20)

    def summary(self, held: int) -> dict:
        """The books beside the kernel's figures; ``held`` is what the store's host buffers
        hold (arena, pinned and pageable buffers)."""
        available, resident = self.read()
        return {
            "available_bytes": available,
            "resident_bytes": resident,
            "store_held_bytes": held,
            # what the process holds outside the store's buffers: CUDA, Python, the
            # libraries, task temporaries, cached pinned blocks
            "other_bytes": max(0, resident - held),
            "lowest_available_bytes": self.lowest_available,
            "headroom_bytes": self.headroom,
            "process_limit_bytes": self.process_limit,
            "short_events": self.short_events,
        }
