"""Clean copies: a value read back from the host keeps its host copy while it stays
unchanged on the device, so spilling it again moves nothing; the copies are the first host
memory given back, before any value is written down."""

from __future__ import annotations

import numpy as np
from numpy_codec import NumpyCodec

from spillway.memory.host import HostBuffers
from spillway.memory.store import TieredStore

MB = 2**20


def chunk(i: int) -> np.ndarray:
    return np.random.default_rng(i).standard_normal(MB // 8)  # 1 MiB float64


def make(below, device_mb=2, host_mb=8, rank=None):
    return TieredStore(device_limit=device_mb * MB, host_limit=host_mb * MB, codec=NumpyCodec(),
                       below=below(), host=HostBuffers(), rank=rank)


def test_a_value_read_back_and_spilled_again_moves_no_byte(below):
    s = make(below)
    for i in range(3):
        s[i] = chunk(i)
    assert s.tier_of(0) == "host" and s.stats.bytes["device_to_host"] == MB
    np.testing.assert_array_equal(s[0], chunk(0))  # back on the device; 1 spilled for it
    assert s.stats.bytes["device_to_host"] == 2 * MB and s.summary()["host_clean_bytes"] == MB
    s[0]
    s[2]  # 0 is now the least recently used: it goes again, and its copy is there
    s[3] = chunk(3)
    assert s.tier_of(0) == "host" and s.stats.clean_bytes == MB
    assert s.stats.bytes["device_to_host"] == 2 * MB  # 0 left the device again without a copy
    assert s.held_bytes == 4 * MB and s.peak_bytes == 4 * MB
    for i in range(4):
        np.testing.assert_array_equal(s[i], chunk(i))
    s.close()


def test_clean_copies_go_before_any_value_is_written_down(below):
    s = make(below, host_mb=4)
    for i in range(5):  # 3 and 4 on the device, 0 to 2 on the host, a MiB of it free
        s[i] = chunk(i)
    np.testing.assert_array_equal(s[0], chunk(0))  # 3 spilled for it; 0's copy kept in the free MiB
    assert s.summary()["host_clean_bytes"] == MB and s.host_bytes == 4 * MB
    s[5] = chunk(5)  # 4's spill needs a MiB of the full host tier: 0's copy gives it
    assert s.summary()["host_clean_bytes"] == 0 and s.tier_of(0) == "device" and s.tier_of(4) == "host"
    lowered = f"host_to_{s.below[0].name}"
    assert s.stats.bytes[lowered] == 0 and s.below_bytes == 0  # nothing was written down
    for i in range(6):
        np.testing.assert_array_equal(s[i], chunk(i))
    s.close()


def test_a_value_replaced_or_deleted_takes_its_clean_copy_with_it(below):
    s = make(below)
    for i in range(3):
        s[i] = chunk(i)
    s[0]
    assert s.summary()["host_clean_bytes"] == MB
    s[0] = chunk(10)  # a new value under the same key: the old copy is not its own
    assert s.summary()["host_clean_bytes"] == 0
    s[4], s[5] = chunk(4), chunk(5)  # 0 spilled again: copied, not taken from the old copy
    np.testing.assert_array_equal(s[0], chunk(10))
    s[1]
    assert s.summary()["host_clean_bytes"] >= MB
    del s[1]
    assert 1 not in s and s.held_bytes == 4 * MB
    for i in (0, 2, 4, 5):
        np.testing.assert_array_equal(s[i], chunk(10 if i == 0 else i))
    s.close()


def test_a_clean_copy_is_kept_only_where_the_host_tier_has_room_as_it_is(below):
    s = make(below, host_mb=1)
    for i in range(4):  # 2 on the device, 1 on the host, 1 below
        s[i] = chunk(i)
    below_before = s.below_bytes
    s[0]  # read back from below into a host buffer: keeping it would pass the host's limit
    assert s.summary()["host_clean_bytes"] == 0 and s.host_bytes <= MB
    assert s.below_bytes <= below_before + MB
    for i in range(4):
        np.testing.assert_array_equal(s[i], chunk(i))
    s.close()
