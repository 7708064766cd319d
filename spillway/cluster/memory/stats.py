"""What the tiered store moved between its tiers, how much and how long it took."""

from __future__ import annotations

from dataclasses import dataclass, field

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
