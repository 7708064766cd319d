"""The disk tier where it ends: values that compress stored (and counted) at their
compressed size, a full disk that fails the write needing it with one line naming the
tiers and the spill directory, leaving every value where it was and no file behind."""

from __future__ import annotations

import numpy as np
import pytest
from numpy_codec import NumpyCodec
from small_disk import SmallDisk

from spillway.options.errors import SpillDiskFull
from spillway.memory import disk as disk_module
from spillway.memory.codecs import HostCopy
from spillway.memory.disk import DiskTier
from spillway.memory.store import TieredStore

MB = 2**20


def _alloc(n):
    return np.empty(n, dtype=np.uint8)


def compressible(i: int, n: int = MB // 8) -> np.ndarray:
    """Float64 values of few distinct levels: they compress several times over."""
    return np.random.default_rng(i).integers(0, 4, n).astype(np.float64)


def uniform(i: int, n: int = MB // 8) -> np.ndarray:
    return np.random.default_rng(i).random(n)


def incompressible(i: int, n: int = MB // 8) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, n * 8, dtype=np.uint8).view(np.float64)


def _copy(a: np.ndarray) -> HostCopy:
    return HostCopy((a.nbytes,), np.dtype(np.uint8), "C", a.view(np.uint8).copy())


@pytest.mark.parametrize("piece", [None, 256 * 1024])
def test_values_that_compress_are_stored_and_counted_at_their_stored_size(tmp_path, monkeypatch, piece):
    if piece:  # several pieces, each compressed by a pool thread
        monkeypatch.setattr(disk_module, "PIECE", piece)
        monkeypatch.setattr(disk_module, "SAMPLE", piece // 2)
    disk = DiskTier(str(tmp_path))
    values = {"few levels": compressible(1), "uniform": uniform(2), "random bytes": incompressible(3)}
    for name, a in values.items():
        disk.put(name, _copy(a))
    stored = {name: disk.meta[name].stored for name in values}
    assert stored["few levels"] < 0.3 * MB
    assert 0.8 * MB < stored["uniform"] < 0.95 * MB  # random mantissas: about a tenth saved
    assert stored["random bytes"] == MB and disk.meta["random bytes"].pieces is None
    assert disk.nbytes == sum(stored.values()) and disk.raw_nbytes == 3 * MB
    import os

    assert sum(os.path.getsize(disk.meta[n].path) for n in values) == disk.nbytes
    for name, a in values.items():
        back = disk.get(name, _alloc)
        np.testing.assert_array_equal(back.buffer.view(np.float64), a)
        disk.delete(name)
    assert disk.nbytes == 0 and disk.raw_nbytes == 0 and not os.listdir(disk.directory)
    disk.close()


def test_compression_can_be_turned_off(tmp_path):
    disk = DiskTier(str(tmp_path), compress=False)
    disk.put("a", _copy(compressible(1)))
    assert disk.nbytes == MB and disk.meta["a"].pieces is None
    disk.close()


def test_a_write_the_disk_has_no_room_for_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(disk_module, "PIECE", 256 * 1024)
    disk = SmallDisk(str(tmp_path), capacity=MB + 300 * 1024, compress=False)
    disk.put("a", _copy(uniform(1)))
    with pytest.raises(OSError) as e:
        disk.put("b", _copy(uniform(2)))
    assert disk_module.is_full(e.value) and disk.full_errors >= 1
    assert disk.files() == [disk.meta["a"].path.rsplit("/", 1)[1]] and disk.on_disk() == MB
    assert disk.nbytes == MB and "b" not in disk
    disk.close()


def _store(tmp_path, capacity, **kwargs):
    return TieredStore(device_limit=2 * MB, host_limit=2 * MB, codec=NumpyCodec(),
                       below=[SmallDisk(str(tmp_path), capacity, compress=False)], **kwargs)


def test_a_full_disk_fails_the_write_that_needed_it_with_one_line_and_keeps_every_value(tmp_path):
    heard = []
    s = _store(tmp_path, capacity=3 * MB)
    s.name = "worker 0 (tcp://127.0.0.1:1)"
    s.on_disk_full = heard.append
    values = {}
    with pytest.raises(SpillDiskFull) as e:
        for i in range(20):
            values[i] = uniform(i)
            s[i] = values[i]
    line = str(e.value)
    failed = i
    assert "\n" not in line and line.startswith("worker 0 (tcp://127.0.0.1:1): the spill disk is full (")
    for part in ("No space left on device", s.below[0].directory, "device 2.00 MiB of a 2.00 MiB limit",
                 "host tier 2.00 MiB of a 2.00 MiB limit", "disk 3.00 MiB written", "larger local-directory"):
        assert part in line, (part, line)
    assert heard == [line] and s.disk_full == line
    # the value that needed the room is not stored; every other is, with its bytes
    assert failed not in s and len(s) == failed
    for k in range(failed):
        np.testing.assert_array_equal(s[k], values[k])
    # nothing on the disk but what the tier knows of
    assert s.below[0].on_disk() == s.below[0].nbytes
    assert len(s.below[0].files()) == len(s.below[0].meta)
    for k in list(s):
        del s[k]
    assert s.below[0].files() == [] and s.below[0].nbytes == 0 and s.host_bytes == 0
    # the disk has room again: the store goes on, and says the disk is no longer full
    for i in range(6):
        s[i] = uniform(i)
    assert s.below[0].nbytes > 0 and s.disk_full is None
    s.close()


def test_a_read_back_that_needs_room_on_a_full_disk_fails_and_loses_nothing(tmp_path):
    s = _store(tmp_path, capacity=2 * MB)
    for i in range(6):  # 2 on the device, 2 on the host, 2 on disk: the disk is full
        s[i] = uniform(i)
    on_disk = [i for i in range(6) if s.tier_of(i) == "disk"]
    assert len(on_disk) == 2
    # reading one back needs its host buffer, whose room is the host tier's, whose room is
    # the disk's: nothing can move
    s.host_limit = 0
    with pytest.raises(SpillDiskFull):
        s[on_disk[0]]
    s.host_limit = 2 * MB
    assert sorted(s) == list(range(6))
    for i in range(6):
        np.testing.assert_array_equal(s[i], uniform(i))
    s.close()


def test_spill_on_demand_stops_at_a_full_disk_and_says_so(tmp_path):
    s = _store(tmp_path, capacity=MB)
    for i in range(5):
        s[i] = uniform(i)
    assert s.evict_for(10 * MB) < 10 * MB
    assert s.evict_met_full_disk and "the spill disk is full" in s.disk_full
    s.close()


# --- its rates


def test_the_probe_measures_both_rates_and_leaves_no_file(tmp_path):
    before = sorted(tmp_path.iterdir())
    write, read = disk_module.probe_rates(str(tmp_path), nbytes=2 * MB, piece=MB // 2)
    assert write > 0 and read > 0
    assert sorted(tmp_path.iterdir()) == before


def test_a_probe_that_fails_leaves_no_file_and_the_tier_measures_from_spills_alone(tmp_path, monkeypatch, caplog):
    disk = DiskTier(str(tmp_path))

    def no_room(fd, view, offset):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk_module, "_write_all", no_room)
    with caplog.at_level("INFO", logger="spillway.memory"):
        disk.start_probe().join(10)
    assert disk.probed is None and "was not probed" in caplog.text and "No space left" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == [disk_module.os.path.basename(disk.directory)]
    assert disk.rates() == {"write": 0.0, "write_from": None, "read": 0.0, "read_from": None}
    assert disk.start_probe() is None  # once
    disk.close()


def test_the_spills_rate_replaces_the_probe_s_once_they_have_moved_enough(tmp_path, monkeypatch):
    monkeypatch.setattr(disk_module, "SPILLS_SAY", 2 * MB)
    disk = DiskTier(str(tmp_path), compress=False)
    disk.probed = (1.0, 2.0)  # bytes per second: far below any real disk
    disk.put("a", _copy(uniform(1)))
    assert disk.rates() == {"write": 1.0, "write_from": "probe", "read": 2.0, "read_from": "probe"}
    disk.put("b", _copy(uniform(2)))
    for key in ("a", "b"):
        disk.get(key, _alloc)
    rates = disk.rates()
    assert rates["write_from"] == rates["read_from"] == "spills"
    assert rates["write"] == pytest.approx(2 * MB / disk.writes.seconds) and rates["write"] > 1000
    assert rates["read"] == pytest.approx(2 * MB / disk.reads.seconds) and rates["read"] > 1000
    disk.close()
