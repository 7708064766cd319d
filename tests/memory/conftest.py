"""The tier stacks the store's tests run on: what lies below the host tier.

A tier defined here and named in :data:`STACKS` runs every store test that takes the
``below`` fixture, with nothing in the store changed: the store knows the tiers below
the host through :class:`~spillway.memory.tier.SegmentTier` alone."""

from __future__ import annotations

import threading

import pytest

from spillway.memory.disk import DiskTier
from spillway.memory.tier import SegmentTier

MB = 2**20


class CheckedTier:
    """A segment tier that keeps segments in a dict and fails the test on a call the
    store should never make: a put over a key it holds, a get or delete of one it does
    not. It counts its calls, and moves every byte (a get hands back a copy, as a tier
    whose segments are not in host memory does)."""

    def __init__(self, name: str = "checked", limit: int | None = None):
        self.name = name
        self.where = f"the {name} tier"
        self.limit = limit
        self.nbytes = 0
        self.calls = {"put": 0, "get": 0, "delete": 0}
        self.held: dict = {}
        self._lock = threading.Lock()  # the store's prefetch thread reads beside its lock

    def room(self) -> int | None:
        return None if self.limit is None else max(0, self.limit - self.nbytes)

    def rates(self) -> dict:
        return {"write": 0.0, "read": 0.0, "write_from": None, "read_from": None}

    def put(self, key, copy, itemsize: int = 8) -> None:
        with self._lock:
            assert key not in self.held, f"put over {key!r}, which the {self.name} tier holds"
            self.calls["put"] += 1
            self.held[key] = (copy.shape, copy.dtype, copy.order, bytes(memoryview(copy.buffer).cast("B")))
            self.nbytes += copy.nbytes

    def get(self, key, alloc):
        import numpy as np

        from spillway.memory.codecs import HostCopy

        with self._lock:
            assert key in self.held, f"get of {key!r}, which the {self.name} tier does not hold"
            self.calls["get"] += 1
            shape, dtype, order, data = self.held[key]
        buffer = alloc(len(data))
        np.frombuffer(buffer, dtype=np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)
        return HostCopy(shape, dtype, order, buffer)

    def delete(self, key) -> None:
        with self._lock:
            assert key in self.held, f"delete of {key!r}, which the {self.name} tier does not hold"
            self.calls["delete"] += 1
            self.nbytes -= len(self.held.pop(key)[3])

    def close(self) -> None:
        self.held.clear()


#: name -> the tiers below the host, from a directory for those that write files
STACKS = {
    "disk": lambda d: [DiskTier(str(d))],
    # the first disk holds a couple of values; past it, they move on to a second directory
    "disk+disk2": lambda d: [DiskTier(str(d / "first"), limit=2 * MB), DiskTier(str(d / "second"), name="disk2")],
    "checked+disk": lambda d: [CheckedTier(limit=2 * MB), DiskTier(str(d))],
}


@pytest.fixture(params=list(STACKS))
def below(request, tmp_path):
    """Makes the tiers below the host of one stack (a test's stores each take fresh ones)."""
    def make():
        tiers = STACKS[request.param](tmp_path)
        assert all(isinstance(t, SegmentTier) for t in tiers)
        return tiers

    return make
