"""What the tiered store moved between its tiers, how much and how long it took."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .tier import MOVES

__all__ = ["MOVES", "TierStats"]


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
    #: of the device -> host seconds, the time spent getting host buffers (writing host
    #: values to disk for room, pinning or first-touching new buffers), not copying
    spill_alloc_s: float = 0.0
    prefetched_bytes: int = 0
    #: of the host -> below bytes, those the drain wrote off the spills' path
    drained_bytes: int = 0
    #: bytes the scheduler said its admitted graphs write to disk here, summed over its
    #: words (:meth:`~spillway.memory.store.TieredStore.write_ahead`)
    ahead_said_bytes: int = 0
    #: of the host -> below bytes, those written because the machine was short of memory
    #: for a new host buffer (:meth:`~spillway.memory.store.TieredStore.relieve_host` and
    #: the room a new buffer needs), and those written because the host tier was at its
    #: limit, on the spills' path
    room_written_bytes: int = 0
    limit_written_bytes: int = 0
    #: of the host -> below bytes, those of groups a task here still waited for (read
    #: back later, unless the disk was forced: the rest were needed by no task here)
    needed_written_bytes: int = 0
    #: bytes spilled again without a copy: their host copies were kept when they were
    #: read back, and the values had not changed (not counted in device -> host)
    clean_bytes: int = 0
    ondemand_events: int = 0
    ondemand_bytes: int = 0

    @classmethod
    def of(cls, moves: Sequence[str]) -> TierStats:
        """Stats of a stack whose moves are ``moves`` (:func:`~.tier.moves_of`)."""
        return cls(dict.fromkeys(moves, 0), dict.fromkeys(moves, 0.0), dict.fromkeys(moves, 0))

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
            "spill_alloc_s": self.spill_alloc_s,
            "prefetched_bytes": self.prefetched_bytes,
            "drained_bytes": self.drained_bytes,
            "ahead_said_bytes": self.ahead_said_bytes,
            "room_written_bytes": self.room_written_bytes,
            "limit_written_bytes": self.limit_written_bytes,
            "needed_written_bytes": self.needed_written_bytes,
            "clean_bytes": self.clean_bytes,
            "ondemand_events": self.ondemand_events,
            "ondemand_bytes": self.ondemand_bytes,
        }


class MoveRates:
    """A tier whose rates are those the store's moves into it (``write``) and out of it
    (``read``) ran at: the device's and the host's, whose copies the store times (the
    store sets these once it has its stack)."""

    stats: TierStats | None = None
    moves_in: tuple[str, ...] = ()
    moves_out: tuple[str, ...] = ()

    def rates(self) -> dict:
        out: dict = {}
        for way, moves in (("write", self.moves_in), ("read", self.moves_out)):
            stats = self.stats
            nbytes = sum(stats.bytes[m] for m in moves) if stats is not None else 0
            seconds = sum(stats.seconds[m] for m in moves) if stats is not None else 0.0
            rate = nbytes / seconds if nbytes and seconds > 0 else 0.0
            out[way], out[f"{way}_from"] = rate, ("moves" if rate else None)
        return out
