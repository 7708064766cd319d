"""The bench's record of garbage-collector pauses (:mod:`spillway_bench.pauses`)."""

from __future__ import annotations

import gc

from spillway_bench import pauses


def test_a_full_collection_of_many_objects_is_kept_and_then_forgotten():
    pauses.watch()
    pauses.watch()  # once only
    assert gc.callbacks.count(pauses._callback) == 1
    pauses.taken()
    junk = [[i, {i: str(i)}] for i in range(600_000)]
    junk.append(junk)  # a cycle: the full collection has work to do
    gc.collect(2)
    found = pauses.taken()
    assert found["count"] >= 1 and found["max_s"] >= pauses.KEEP_S and found["by_generation"].get(2, 0) >= 1
    assert pauses.taken()["count"] == 0
    del junk
