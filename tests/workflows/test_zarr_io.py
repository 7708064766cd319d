"""Zarr I/O (the spillway/workflows/zarr package): which codec chains the direct (KvikIO) path takes,
and that its logic (chunk keys, edge chunks, fill values, skipped chunks) gives zarr's
values and zarr's files bit for bit. The direct path runs here over host buffers
(HostIO), the same code the GPU workers run over KvikIO and CuPy."""

from __future__ import annotations

import itertools
import os

import dask.array as da
import numpy as np
import pytest
import zarr

from spillway.workflows.zarr import device_io, read, write
from spillway.workflows.zarr.chunk_files import CODECS, RAW, SHARDED, ZSTD, chunk_files_of
from spillway.workflows.zarr.fallback import Fallback
from spillway.workflows.zarr.host_io import HostIO
from spillway.workflows.zarr.shards import shard_index
from spillway.workflows.zarr.zstd import check_zstd_headers, zstd_content_size


def _array(path, data, chunks, **kw):
    z = zarr.create_array(store=str(path), shape=data.shape, chunks=chunks, dtype=data.dtype, zarr_format=3, **kw)
    z[...] = data
    return z


def _data(shape=(10, 7), dtype="float32"):
    x = np.random.default_rng(0).random(shape).astype(dtype)
    x[0:4, 0:3] = 0  # one chunk of fill values: zarr writes no file for it
    return x


@pytest.mark.parametrize("kw, expected", [
    ({"compressors": None}, RAW),
    ({}, ZSTD),  # zarr's default: bytes + zstd without checksum
    ({"compressors": zarr.codecs.ZstdCodec(level=3, checksum=True)}, CODECS),
    ({"compressors": zarr.codecs.GzipCodec()}, CODECS),
    ({"compressors": zarr.codecs.BloscCodec()}, CODECS),
    ({"compressors": None, "serializer": zarr.codecs.BytesCodec(endian="big")}, CODECS),
    ({"compressors": None, "filters": [zarr.codecs.TransposeCodec(order=(1, 0))]}, CODECS),
    ({"compressors": None, "shards": (8, 6)}, SHARDED),
    ({"shards": (8, 6)}, SHARDED),
    ({"shards": (8, 6), "compressors": zarr.codecs.GzipCodec()}, CODECS),
])
def test_chunk_files_name_the_codec_chains_the_direct_path_takes(tmp_path, kw, expected):
    z = _array(tmp_path / "x.zarr", _data(), (4, 3), **kw)
    files = chunk_files_of(z)
    assert files.encoding == expected
    assert files.root == str(tmp_path / "x.zarr") and os.path.isabs(files.root)
    if "shards" in kw:  # a dask block per shard
        assert files.chunk_shape == (8, 6) and files.dask_chunks() == ((8, 2), (6, 1))
        if expected == SHARDED:
            assert (files.inner_shape, files.inner_grid) == ((4, 3), (2, 2))
    else:
        assert files.chunk_shape == (4, 3) and files.dask_chunks() == ((4, 4, 2), (3, 3, 1))


def test_chunk_paths_follow_both_key_encodings(tmp_path):
    z = _array(tmp_path / "d.zarr", _data(), (4, 3), compressors=None)
    assert chunk_files_of(z).chunk_path((2, 1)) == str(tmp_path / "d.zarr" / "c" / "2" / "1")
    v2 = _array(tmp_path / "v.zarr", _data(), (4, 3), compressors=None,
                chunk_key_encoding={"name": "v2", "separator": "."})
    files = chunk_files_of(v2)
    assert files.key_encoding == "v2" and files.chunk_path((2, 1)) == str(tmp_path / "v.zarr" / "2.1")
    assert os.path.exists(files.chunk_path((2, 1)))


def test_an_array_inside_a_group_is_found(tmp_path):
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=3)
    z = group.create_array("t2m", shape=(10, 7), chunks=(4, 3), dtype="float32", compressors=None)
    z[...] = _data()
    files = chunk_files_of(zarr.open_array(str(tmp_path / "g.zarr" / "t2m"), mode="r"))
    assert files.root == str(tmp_path / "g.zarr" / "t2m") and files.encoding == RAW
    assert os.path.exists(files.chunk_path((2, 2)))


def _each_block(files):
    chunks = files.dask_chunks()
    for coords in itertools.product(*(range(len(c)) for c in chunks)):
        shape = tuple(chunks[d][i] for d, i in enumerate(coords))
        region = tuple(slice(i * c, i * c + n) for i, c, n in zip(coords, files.chunk_shape, shape))
        yield coords, shape, region


@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "uint8"])
@pytest.mark.parametrize("kw", [{"compressors": None}, {}, {"compressors": None, "fill_value": 7}])
def test_direct_reads_equal_zarr_bit_for_bit(tmp_path, dtype, kw):
    data = _data(dtype=dtype) if np.dtype(dtype).kind == "f" else \
        np.random.default_rng(1).integers(0, 100, (10, 7)).astype(dtype)
    data[0:4, 0:3] = kw.get("fill_value", 0)
    z = _array(tmp_path / "x.zarr", data, (4, 3), **kw)
    files = chunk_files_of(z)
    assert not os.path.exists(files.chunk_path((0, 0)))  # the fill-only chunk has no file
    for coords, shape, region in _each_block(files):
        got = read.read_direct(files, coords, shape, HostIO())
        assert got.dtype == data.dtype and got.shape == shape and got.flags.c_contiguous
        assert got.tobytes() == data[region].tobytes(), coords


@pytest.mark.parametrize("shape, shards, inner", [
    ((10, 7), (8, 6), (4, 3)),  # inner chunks interleave: assembled by one copy
    ((10, 7), (8, 6), (1, 6)),  # rows of the shard: each inner chunk a slab, no copy
    ((9, 4, 5), (6, 4, 5), (2, 4, 5)),  # days of a record, as the bench and notebook write
    ((9, 4, 5), (6, 4, 5), (1, 2, 5)),
])
@pytest.mark.parametrize("kw", [{}, {"compressors": None}, {"fill_value": 3.0}])
def test_direct_reads_of_shards_equal_zarr_bit_for_bit(tmp_path, shape, shards, inner, kw):
    data = np.round(np.random.default_rng(2).standard_normal(shape), 2).astype("float32")
    data[:inner[0]] = kw.get("fill_value", 0)  # inner chunks of fill values: not stored in the shard
    data[-1] = -0.0 if "fill_value" not in kw else 3.0
    z = _array(tmp_path / "s.zarr", data, inner, shards=shards, **kw)
    files = chunk_files_of(z)
    assert files.encoding == SHARDED and files.inner_encoding == (RAW if "compressors" in kw else ZSTD)
    index = shard_index(files, files.chunk_path((0,) * len(shape)),
                        os.path.getsize(files.chunk_path((0,) * len(shape))))
    assert (index[0] == 2**64 - 1).all()  # the first inner chunk holds only the fill value
    for coords, block_shape, region in _each_block(files):
        got = read.read_direct(files, coords, block_shape, HostIO())
        assert got.shape == block_shape and got.flags.c_contiguous
        assert got.tobytes() == data[region].tobytes(), coords


def test_a_damaged_shard_index_falls_back_to_zarr(tmp_path):
    z = _array(tmp_path / "s.zarr", _data(), (4, 3), shards=(8, 6))
    files = chunk_files_of(z)
    path = files.chunk_path((1, 0))
    with open(path, "r+b") as f:
        f.seek(-6, os.SEEK_END)
        f.write(b"\x01")  # a bit of the index, under its CRC32C
    with pytest.raises(Fallback, match="CRC32C"):
        read.read_direct(files, (1, 0), (2, 6), HostIO())


def test_zstd_frame_headers_are_checked_before_decoding():
    import numcodecs

    frame = numcodecs.Zstd(level=3).encode(np.arange(1000, dtype="float32"))
    assert zstd_content_size(frame[:18]) == 4000
    check_zstd_headers([frame[:18]], [4000])
    with pytest.raises(Fallback, match="states 4000 bytes, expected 4004"):
        check_zstd_headers([frame[:18]], [4004])
    with pytest.raises(Fallback, match="not a zstd frame"):
        check_zstd_headers([b"\0" * 18], [4000])


def test_only_many_frames_per_chunk_are_decoded_on_the_gpu(tmp_path):
    plain = chunk_files_of(_array(tmp_path / "z.zarr", _data(), (4, 3)))
    assert plain.encoding == ZSTD and plain.frames_per_chunk == 1 and not plain.gpu_decodes()
    days = np.zeros((730, 4, 5), "float32")
    sharded = chunk_files_of(_array(tmp_path / "s.zarr", days, (1, 4, 5), shards=(365, 4, 5)))
    assert sharded.frames_per_chunk == 365 and sharded.gpu_decodes()
    raw = chunk_files_of(_array(tmp_path / "r.zarr", days, (1, 4, 5), shards=(365, 4, 5), compressors=None))
    assert not raw.gpu_decodes()  # nothing to decode


def test_a_chunk_file_of_the_wrong_size_falls_back_to_zarr(tmp_path):
    z = _array(tmp_path / "x.zarr", _data(), (4, 3), compressors=None)
    files = chunk_files_of(z)
    with open(files.chunk_path((1, 1)), "ab") as f:
        f.write(b"\0")
    with pytest.raises(Fallback, match="expected 48"):
        read.read_direct(files, (1, 1), (4, 3), HostIO())


def _files(root):
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


@pytest.mark.parametrize("fill", [0.0, 1.5, float("nan")])
def test_direct_writes_give_zarrs_files_byte_for_byte(tmp_path, fill):
    data = _data(dtype="float64")
    data[4:8, 3:6] = -0.0  # not the fill value 0.0 by its bits: zarr writes it
    data[8:10, 6:7] = fill  # an edge chunk of fill values only: no file
    data[0:4, 0:3] = fill
    reference = _array(tmp_path / "zarr.zarr", data, (4, 3), compressors=None, fill_value=fill)
    ours = zarr.create_array(store=str(tmp_path / "ours.zarr"), shape=data.shape, chunks=(4, 3), dtype=data.dtype,
                             zarr_format=3, compressors=None, fill_value=fill)
    files = chunk_files_of(ours)
    written = sum(write.write_direct(files, coords, data[region], HostIO())
                  for coords, _, region in _each_block(files))
    assert _files(tmp_path / "ours.zarr") == _files(tmp_path / "zarr.zarr")
    assert written == 7 * 4 * 3 * 8  # nine chunks of 4x3 float64 (edges whole) but the two left out
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "ours.zarr"))[...], reference[...])


def test_dask_graph_of_the_device_path_reads_and_writes_like_zarr(tmp_path, monkeypatch):
    """open_array / store with CuPy chunks, their tasks run over host buffers: the store
    they write is the CPU path's, file for file, and reads back equal."""
    monkeypatch.setattr(device_io, "kvikio_available", lambda: True)
    monkeypatch.setattr(device_io, "gpu_io", HostIO)
    monkeypatch.setattr(write, "_on_device", lambda block: True)
    data = _data((50, 33), "float32")
    x = da.from_array(data, chunks=(20, 15))
    written = write.store(x, str(tmp_path / "gpu.zarr"))
    assert int(written.compute(scheduler="sync")) == 9 * 20 * 15 * 4  # edge chunks are written whole
    monkeypatch.setattr(write, "_on_device", lambda block: False)
    da.compute(write.store(x, str(tmp_path / "cpu.zarr")), scheduler="sync")
    assert _files(tmp_path / "gpu.zarr") == _files(tmp_path / "cpu.zarr")

    files = chunk_files_of(zarr.open_array(str(tmp_path / "gpu.zarr")))
    back = read.chunk_reads(files, np.empty((0, 0), np.float32), "read-test")
    assert back.chunks == ((20, 20, 10), (15, 15, 3))
    assert back.compute(scheduler="sync").tobytes() == data.tobytes()

    # without KvikIO on the worker, zarr reads it on the host (and the copy to the device is CuPy's)
    monkeypatch.setattr(device_io, "kvikio_available", lambda: False)
    monkeypatch.setattr(read, "_to_device", lambda block: block)
    again = read.chunk_reads(files, np.empty((0, 0), np.float32), "read-test-host")
    assert again.compute(scheduler="sync").tobytes() == data.tobytes()


def test_the_cpu_path_writes_uncompressed_chunks_and_reads_with_from_zarr(tmp_path):
    data = _data((30, 20), "float64")
    da.compute(write.store(da.from_array(data, chunks=(7, 20)), str(tmp_path / "x.zarr")), scheduler="sync")
    z = zarr.open_array(str(tmp_path / "x.zarr"))
    assert z.compressors == () and z.filters == () and z.chunks == (7, 20)
    assert chunk_files_of(z).encoding == RAW
    back = read.open_array(str(tmp_path / "x.zarr"), "numpy")
    # da.from_zarr over the store as pinned (reads through its directory, never by name)
    assert back.name.startswith("from-zarr-") and back.chunks == ((7, 7, 7, 7, 2), (20,))
    np.testing.assert_array_equal(back.compute(scheduler="sync"), data)
    with pytest.raises(ValueError, match="backend: 'torch' is not one of numpy, cupy"):
        read.open_array(str(tmp_path / "x.zarr"), "torch")


def test_all_fill_follows_zarr():
    assert write.all_fill(np, np.zeros(4), 0.0)
    assert not write.all_fill(np, np.array([0.0, -0.0]), 0.0)
    assert write.all_fill(np, np.full(3, np.nan), float("nan"))
    assert not write.all_fill(np, np.array([np.nan, 1.0]), float("nan"))
    assert write.all_fill(np, np.full(3, 7, dtype=np.int16), 7)


def test_describe_without_kvikio_says_how_chunks_reach_the_device(monkeypatch):
    monkeypatch.setattr(device_io, "kvikio_available", lambda: False)
    described = device_io.describe()
    assert described["kvikio"] is None and described["mode"] == "host codecs + copy to device"


@pytest.mark.gpu
@pytest.mark.parametrize("kw", [{"compressors": None}, {}])
def test_kvikio_reads_and_writes_on_the_gpu_equal_zarr(tmp_path, kw):
    """On the GPU host: chunks read with KvikIO (and nvCOMP for zstd, where installed)
    into CuPy arrays equal zarr's bits, and KvikIO writes give zarr's files."""
    cupy = pytest.importorskip("cupy")
    pytest.importorskip("kvikio")
    data = _data((50, 33), "float32")
    _array(tmp_path / "x.zarr", data, (20, 15), **kw)
    back = read.open_array(str(tmp_path / "x.zarr"), "cupy")
    assert isinstance(back._meta, cupy.ndarray)
    got = back.compute(scheduler="threads")
    assert isinstance(got, cupy.ndarray) and cupy.asnumpy(got).tobytes() == data.tobytes()

    x = da.from_array(cupy.asarray(data), chunks=(20, 15), asarray=False)
    da.compute(write.store(x, str(tmp_path / "gpu.zarr")), scheduler="threads")
    da.compute(write.store(da.from_array(data, chunks=(20, 15)), str(tmp_path / "cpu.zarr")), scheduler="sync")
    assert _files(tmp_path / "gpu.zarr") == _files(tmp_path / "cpu.zarr")
    assert device_io.describe()["mode"].startswith("KvikIO")


class DeviceLike:
    """A stand-in for a CuPy chunk on CPU: it exports ``__cuda_array_interface__`` and,
    like CuPy, refuses to become a NumPy array implicitly."""

    def __init__(self, host):
        self.host = np.ascontiguousarray(host)
        self.shape, self.dtype, self.ndim, self.size = host.shape, host.dtype, host.ndim, host.size
        self.nbytes = host.nbytes

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (0, False), "version": 3}

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` ...")

    def __array_function__(self, func, types, args, kwargs):  # a duck array to dask, as CuPy is
        return NotImplemented

    def __getitem__(self, index):
        return DeviceLike(self.host[index])

    def astype(self, dtype, **kwargs):
        return DeviceLike(self.host.astype(dtype))

    def get(self):
        return self.host.copy()


def _device_chunks(data, chunks):
    """A dask array whose blocks are DeviceLike while its meta says NumPy, as for many
    graphs that make CuPy chunks."""
    return da.from_array(data, chunks=chunks).map_blocks(DeviceLike, meta=np.empty((0,) * data.ndim, data.dtype))


def test_dask_store_of_device_chunks_into_zarr_fails_without_and_writes_with_the_host_buffer(tmp_path):
    from spillway.memory import zarr_buffer as buffers

    data = _data((50, 33), "float32")
    for installed in (False, True):
        target = zarr.create_array(store=str(tmp_path / f"{installed}.zarr"), shape=data.shape, chunks=(20, 15),
                                   dtype=data.dtype, zarr_format=3)
        if not installed:  # zarr's CPU buffer: CuPy's refusal, as on the GPU host
            with pytest.raises(TypeError, match="Implicit conversion to a NumPy array"):
                da.store(_device_chunks(data, (20, 15)), target, lock=False, scheduler="sync")
            continue
        before = zarr.config.get("ndbuffer")
        try:
            buffers.install()
            assert buffers.installed()
            assert zarr.registry.get_ndbuffer_class() is buffers.HostNDBuffer
            da.store(_device_chunks(data, (20, 15)), target, lock=False, scheduler="sync")
            # reads are zarr's CPU path unchanged: NumPy
            back = zarr.open_array(str(tmp_path / f"{installed}.zarr"))[...]
        finally:
            zarr.config.set({"ndbuffer": before})
        assert type(back) is np.ndarray and back.tobytes() == data.tobytes()


def test_the_buffer_qualname_names_the_buffer_class():
    """Workers find the buffer by the name in zarr's config: the module path and class name
    QUALNAME holds lead to the class itself (a move of the module moves the string)."""
    import importlib

    from spillway.memory import zarr_buffer as buffers

    module, _, name = buffers.QUALNAME.rpartition(".")
    assert getattr(importlib.import_module(module), name) is buffers.HostNDBuffer
    assert buffers.QUALNAME == f"{buffers.HostNDBuffer.__module__}.{buffers.HostNDBuffer.__qualname__}"


def test_store_decides_by_each_block_not_the_meta(tmp_path, monkeypatch):
    """Device blocks under a NumPy meta (what random.uniform and most workflows give on
    GPUs) take the device path; NumPy blocks are written by zarr."""
    monkeypatch.setattr(device_io, "kvikio_available", lambda: True)
    monkeypatch.setattr(device_io, "gpu_io", HostIO)
    sent = []
    direct = write.write_direct

    def write_direct(files, coords, block, io):
        sent.append(coords)
        return direct(files, coords, block.get(), io)  # the stand-in's bytes, over host buffers

    monkeypatch.setattr(write, "write_direct", write_direct)
    data = _data((40, 30), "float32")
    da.compute(write.store(_device_chunks(data, (20, 15)), str(tmp_path / "d.zarr")), scheduler="sync")
    assert len(sent) == 4
    da.compute(write.store(da.from_array(data, chunks=(20, 15)), str(tmp_path / "h.zarr")), scheduler="sync")
    assert len(sent) == 4  # host blocks did not take the device path
    assert zarr.open_array(str(tmp_path / "d.zarr"))[...].tobytes() == data.tobytes()
    assert zarr.open_array(str(tmp_path / "h.zarr"))[...].tobytes() == data.tobytes()


def test_gpu_worker_teardown_closes_the_zarr_readers(monkeypatch):
    """The worker plugin knows no workflow: the Zarr readers register their clean-up, and a
    GPU worker's teardown runs it (once, however often it was registered)."""
    from spillway.launch import plugins

    closed = []
    monkeypatch.setattr(plugins, "_TEARDOWNS", [])
    monkeypatch.setattr(device_io, "close_all", lambda: closed.append(1))
    device_io._close_on_teardown()
    device_io._close_on_teardown()
    setup = plugins.WorkerSetup()
    setup.teardown(None)  # a CPU worker: nothing of the GPU's to close
    assert closed == []
    setup.kind = "gpu"
    setup.teardown(None)
    assert closed == [1]
