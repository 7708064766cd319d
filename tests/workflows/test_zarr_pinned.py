"""Stores read through the directory checked (issue 63): after a store is pinned, a swap of
the store, of a directory above it or of one chunk file for a link to another store reads
nothing of the other store, on the CPU path (zarr through the pinned store), the direct
path's reads (the GPU path's logic over host memory) and the reference reads alike."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

import dask.array as da
import numpy as np
import pytest

from spillway.options.errors import ParamError
from spillway.workflows.zarr import read, write
from spillway.workflows.zarr.chunk_files import chunk_files_of
from spillway.workflows.zarr.host_io import HostIO
from spillway.workflows.zarr.pinned import open_pinned, pin_store, read_key


def _store(path, value: float, shape=(12, 8), chunks=(4, 8)) -> str:
    da.compute(write.store(da.full(shape, value, chunks=chunks), str(path)), scheduler="sync")
    return str(path)


@pytest.fixture
def two(tmp_path):
    """Tenant b's store (ones) in its own directory, tenant a's (sevens) elsewhere."""
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    return _store(tmp_path / "b" / "in.zarr", 1.0), _store(tmp_path / "a" / "out.zarr", 7.0)


def _swap_for_link(path: str, target: str) -> None:
    aside = path + ".old"
    os.rename(path, aside)
    os.symlink(target, path)


def test_a_pinned_store_reads_its_own_chunks(two):
    mine, _ = two
    pinned = pin_store(mine)
    assert pinned == os.path.realpath(mine) and pinned.pin.inode == os.stat(mine).st_ino
    assert read.open_array(pinned, "numpy").compute(scheduler="sync").sum() == 12 * 8
    assert read_key(pinned.pin, "c/9/0") is None  # a chunk with no file: the fill value


def test_a_store_swapped_for_a_link_after_the_pin_reads_nothing_of_the_other(two):
    mine, theirs = two
    pinned = pin_store(mine)
    lazy = read.open_array(pinned, "numpy")
    _swap_for_link(mine, theirs)
    with pytest.raises(ParamError, match="was changed to lead through a link"):
        lazy.compute(scheduler="sync")
    with pytest.raises(ParamError, match="was changed to lead through a link"):
        open_pinned(pinned.pin)


def test_a_store_replaced_by_another_directory_is_refused(two, tmp_path):
    mine, _ = two
    pinned = pin_store(mine)
    shutil.move(mine, mine + ".old")
    _store(mine, 3.0)  # another directory at the same name, inside the same tree
    with pytest.raises(ParamError, match=r"is not the store that was checked \(replaced since\)"):
        read.open_array(pinned, "numpy").compute(scheduler="sync")


def test_a_parent_swapped_for_a_link_is_refused(two, tmp_path):
    mine, theirs = two
    pinned = pin_store(mine)
    os.rename(tmp_path / "b", tmp_path / "b.old")
    os.symlink(tmp_path / "a", tmp_path / "b")
    os.symlink(theirs, tmp_path / "a" / "in.zarr")  # b/in.zarr now leads to a's store
    with pytest.raises(ParamError, match="lead through a link"):
        read.open_array(pinned, "numpy").compute(scheduler="sync")


@pytest.mark.parametrize("which", ["chunk", "chunk directory"])
def test_one_chunk_swapped_for_a_link_is_refused_on_both_paths(two, which):
    mine, theirs = two
    pinned = pin_store(mine)
    lazy = read.open_array(pinned, "numpy")
    files = replace(chunk_files_of(open_pinned(pinned.pin)), pin=pinned.pin)
    if which == "chunk":
        _swap_for_link(os.path.join(mine, "c", "1", "0"), os.path.join(theirs, "c", "1", "0"))
    else:
        _swap_for_link(os.path.join(mine, "c", "1"), os.path.join(theirs, "c", "1"))
    with pytest.raises(ParamError, match=r"'c/1(/0)?' in .* is a link"):
        lazy.compute(scheduler="sync")
    with pytest.raises(ParamError, match="is a link"):
        read.read_direct(files, (1, 0), (4, 8), HostIO())
    # the chunks beside it still read (their own bytes)
    assert read.read_direct(files, (2, 0), (4, 8), HostIO()).sum() == 32


def test_a_fifo_in_a_store_is_refused_without_blocking(two):
    mine, _ = two
    pinned = pin_store(mine)
    chunk = os.path.join(mine, "c", "0", "0")
    os.remove(chunk)
    os.mkfifo(chunk)
    with pytest.raises(ParamError, match="is not a regular file"):
        read_key(pinned.pin, "c/0/0")


def test_a_key_that_leaves_the_store_is_refused(two):
    pinned = pin_store(two[0])
    with pytest.raises(ParamError, match="is not a path inside the store"):
        read_key(pinned.pin, "../../a/out.zarr/zarr.json")


def test_the_pin_travels_to_workers(two):
    import pickle

    pinned = pin_store(two[0])
    again = pickle.loads(pickle.dumps(pinned))
    assert again == pinned and again.pin == pinned.pin
    lazy = pickle.loads(pickle.dumps(read.open_array(pinned, "numpy")))
    np.testing.assert_array_equal(lazy.compute(scheduler="sync"), np.ones((12, 8)))


def test_a_missing_store_says_so(tmp_path):
    with pytest.raises(ParamError, match="does not exist"):
        pin_store(str(tmp_path / "nothing.zarr"))
