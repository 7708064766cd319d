"""The staging ring: copies between a "device" and pageable host buffers through pinned
slots, the copy engine and the threads one slot apart; here NumPy arrays play the device
and the slots, so every byte's way is checked without a GPU."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from spillway.memory.staging import StagingRing


def ring(slot_bytes: int = 1000, slots: int = 2, threads: int = 3) -> StagingRing:
    return StagingRing([np.zeros(slot_bytes, dtype=np.uint8) for _ in range(slots)], threads=threads)


@pytest.mark.parametrize("nbytes", [1, 999, 1000, 1001, 2000, 7777])
@pytest.mark.parametrize("slots,threads", [(2, 1), (2, 3), (3, 4)])
def test_every_byte_arrives_in_order_both_ways(nbytes, slots, threads):
    r = ring(slots=slots, threads=threads)
    device = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    filled: list[tuple[int, int]] = []

    def to_slot(slot, offset, n):
        # the slot is free when the copy engine writes it: the threads moved its last bytes
        r.slots[slot][:n] = device[offset:offset + n]
        filled.append((offset, n))
        return lambda: None

    host = np.zeros(nbytes + 5, dtype=np.uint8)  # a larger buffer than the value: as the host tier's
    r.to_host(host, nbytes, to_slot)
    np.testing.assert_array_equal(host[:nbytes], device)
    assert sum(n for _, n in filled) == nbytes and all(n <= 1000 for _, n in filled)

    back = np.zeros(nbytes, dtype=np.uint8)
    pending: dict[int, tuple] = {}

    def from_slot(slot, offset, n):
        # the engine reads the slot later, when waited on: a slot refilled too early fails
        pending[slot] = (offset, n, r.slots[slot][:n].copy())

        def done():
            at, count, seen = pending.pop(slot)
            np.testing.assert_array_equal(r.slots[slot][:count], seen)
            back[at:at + count] = r.slots[slot][:count]
        return done

    r.to_device(host, nbytes, from_slot)
    np.testing.assert_array_equal(back, device)
    assert not pending  # every engine copy was waited on
    r.close()


def test_an_engine_error_is_raised_and_the_ring_stays_usable():
    r = ring()
    device = np.arange(3000, dtype=np.uint64).view(np.uint8)[:3000]

    def failing(slot, offset, n):
        if offset >= 1000:
            raise RuntimeError("copy failed")
        r.slots[slot][:n] = device[offset:offset + n]
        return lambda: None

    with pytest.raises(RuntimeError, match="copy failed"):
        r.to_host(np.zeros(3000, dtype=np.uint8), 3000, failing)
    host = np.zeros(3000, dtype=np.uint8)
    r.to_host(host, 3000, lambda s, o, n: (r.slots[s].__setitem__(slice(0, n), device[o:o + n]), lambda: None)[1])
    np.testing.assert_array_equal(host, device)
    r.close()


def test_one_copy_at_a_time_per_ring():
    r = ring(threads=2)
    inside, most = [0], [0]
    lock = threading.Lock()

    def to_slot(slot, offset, n):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        r.slots[slot][:n] = 7
        with lock:
            inside[0] -= 1
        return lambda: None

    threads = [threading.Thread(target=r.to_host, args=(np.zeros(5000, dtype=np.uint8), 5000, to_slot))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
    r.close()


def test_slots_must_be_one_size():
    with pytest.raises(ValueError, match="one size"):
        StagingRing([np.zeros(10, dtype=np.uint8), np.zeros(20, dtype=np.uint8)])
