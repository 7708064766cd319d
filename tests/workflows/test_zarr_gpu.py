"""On the GPU host: Zarr with device chunks on spillway's own local cluster
(``spillway.local()``, one worker per GPU). A user's ``da.to_zarr`` / ``da.store`` /
``xarray.Dataset.to_zarr`` of CuPy-backed arrays writes (zarr's defaults: zstd; and
sharded), ``--output`` of a workflow whose graph says NumPy but makes CuPy chunks writes,
and sharded zstd stores decode on the GPU with nvCOMP to zarr's bits."""

from __future__ import annotations

import numpy as np
import dask.config
import pytest

pytestmark = pytest.mark.gpu

SHAPE, CHUNKS = (730, 96, 128), (365, 96, 128)


@pytest.fixture(scope="module")
def cluster():
    from spillway.options.gpus import discover

    if not len(discover()):
        pytest.skip("needs a GPU")
    pytest.importorskip("cupy")
    import spillway

    with spillway.local(dashboard_address="127.0.0.1:0") as c:
        assert c.kind == "gpu"
        yield c


def _device_record(seed=0):
    """A CuPy-backed dask array made on the workers (its meta says CuPy) and the same
    values in NumPy: temperatures to 0.01 K, as stored records hold them."""
    import cupy
    import dask.array as da

    host = da.random.default_rng(seed).standard_normal(SHAPE, chunks=CHUNKS, dtype=np.float32)
    host = da.round(250 + 10 * host, 2).astype(np.float32)
    device = host.map_blocks(cupy.asarray, meta=cupy.empty((0, 0, 0), np.float32))
    return device, host


def _rel_error(got, reference) -> float:
    got, reference = np.asarray(got, np.float64), np.asarray(reference, np.float64)
    return float(np.linalg.norm(got - reference) / np.linalg.norm(reference))


def _ndbuffer(dask_worker=None):
    import zarr

    return zarr.config.get("ndbuffer")


def test_gpu_workers_give_zarr_the_host_buffer(cluster):
    from spillway.memory import zarr_buffer as buffers

    assert set(cluster.client.run(_ndbuffer).values()) == {buffers.QUALNAME}


def test_da_to_zarr_of_cupy_chunks_writes_on_the_cluster(cluster, tmp_path):
    import dask.array as da
    import zarr

    device, host = _device_record()
    expected = cluster.compute(host)
    da.to_zarr(device, str(tmp_path / "default.zarr"))  # zarr's defaults: zstd, one frame per chunk
    stored = zarr.open_array(str(tmp_path / "default.zarr"))
    assert [type(c).__name__ for c in stored.compressors] == ["ZstdCodec"]
    assert stored[...].tobytes() == expected.tobytes()

    # sharded (what GPU reads want): dask's store into an array the user created
    target = zarr.create_array(store=str(tmp_path / "sharded.zarr"), shape=SHAPE, chunks=(1, 96, 128),
                               shards=CHUNKS, dtype="float32", zarr_format=3)
    da.store(device, target, lock=False)
    assert zarr.open_array(str(tmp_path / "sharded.zarr"))[...].tobytes() == expected.tobytes()

    # and read back by spillway's reader into CuPy chunks, to the same bits
    back = cluster.open(str(tmp_path / "sharded.zarr"))
    got = cluster.compute(back)
    assert type(got).__module__.startswith("cupy") and got.get().tobytes() == expected.tobytes()


def test_xarray_to_zarr_of_a_cupy_backed_dataset_writes_on_the_cluster(cluster, tmp_path):
    import pandas as pd
    import xarray as xr

    device, host = _device_record(seed=1)
    expected = cluster.compute(host)
    time = pd.date_range("2001-01-01", periods=SHAPE[0], freq="D")
    ds = xr.Dataset({"t2m": (("time", "lat", "lon"), device)}, coords={"time": time})
    for name, encoding in (("default", {}), ("sharded", {"t2m": {"chunks": (1, 96, 128), "shards": CHUNKS}})):
        path = str(tmp_path / f"{name}.zarr")
        ds.to_zarr(path, mode="w", consolidated=False, encoding=encoding)
        back = xr.open_zarr(path, consolidated=False)
        assert back.t2m.shape == SHAPE and (back.time.values == time.values).all()
        values = back.t2m.values
        assert values.tobytes() == expected.tobytes(), name
        assert _rel_error(values, expected) == 0.0


def test_output_of_a_workflow_with_cupy_chunks_under_a_numpy_meta(cluster, tmp_path):
    """``cluster.run(..., output=)``: the workflow's graph says NumPy (random.uniform) while
    its chunks are CuPy; the store is written from the device and reads back to the seeds."""
    import zarr

    from reference_inputs import uniform_numpy

    out = tmp_path / "rows.zarr"
    report = cluster.run("slice", size="4000x3000", step=7, output=str(out), progress=False)
    assert report["bytes_written"] > 0
    stored = zarr.open_array(str(out), mode="r")
    reference = uniform_numpy((4000, 3000), seed=0)[::7]
    assert stored.shape == reference.shape
    assert _rel_error(stored[...], reference) <= 1e-12


def test_sharded_zstd_decodes_on_the_gpu_to_zarrs_bits(tmp_path):
    """In this process: a shard of 365 zstd frames is decoded by nvCOMP in one batch
    (the counters say the GPU decoded every stored frame), equal to zarr's own read."""
    cupy = pytest.importorskip("cupy")
    pytest.importorskip("kvikio")
    pytest.importorskip("nvidia.nvcomp")
    import zarr

    from spillway.workflows.zarr.chunk_files import SHARDED, chunk_files_of
    from spillway.workflows.zarr.decoded import decode_counters
    from spillway.workflows.zarr.read import open_array

    data = np.round(250 + 10 * np.random.default_rng(3).standard_normal(SHAPE), 2).astype(np.float32)
    data[:10] = 0  # ten days of fill: inner chunks not stored
    z = zarr.create_array(store=str(tmp_path / "s.zarr"), shape=SHAPE, chunks=(1, 96, 128), shards=CHUNKS,
                          dtype="float32", zarr_format=3)
    z[...] = data
    files = chunk_files_of(z)
    assert files.encoding == SHARDED and files.gpu_decodes()
    before = decode_counters()["gpu"]
    got = open_array(str(tmp_path / "s.zarr"), "cupy").compute(scheduler="threads")
    after = decode_counters()["gpu"]
    assert isinstance(got, cupy.ndarray) and cupy.asnumpy(got).tobytes() == z[...].tobytes()
    assert after["frames"] - before["frames"] == SHAPE[0] - 10
    assert after["bytes"] - before["bytes"] == (SHAPE[0] - 10) * 96 * 128 * 4


def test_nvcomp_batch_decode_equals_numcodecs():
    """The batch decode alone, frames of several sizes, against numcodecs' Zstd."""
    cupy = pytest.importorskip("cupy")
    pytest.importorskip("kvikio")
    pytest.importorskip("nvidia.nvcomp")
    import numcodecs

    from spillway.workflows.zarr.device_io import KvikIO

    rng = np.random.default_rng(4)
    chunks = [np.round(rng.standard_normal(n), 2).astype(np.float32) for n in (1, 1000, 2**16, 2**20, 3 * 2**20)]
    frames = [cupy.asarray(np.frombuffer(numcodecs.Zstd(level=3).encode(c), np.uint8)) for c in chunks]
    outs = [cupy.empty(c.nbytes, cupy.uint8) for c in chunks]
    # the codec and its stream released here, in order, not by the garbage collector or at exit
    with KvikIO() as io:
        io.decode_zstd(frames, outs)
        io.decode_zstd(frames[::-1], outs[::-1])  # the same codec again, its output form known
    for out, chunk in zip(outs, chunks):
        assert cupy.asnumpy(out).tobytes() == chunk.tobytes()
    # a temporary reader dropped right after its decode (what crashed before)
    again = [cupy.empty(c.nbytes, cupy.uint8) for c in chunks]
    KvikIO().decode_zstd(frames, again)
    import gc

    gc.collect()
    assert all(cupy.asnumpy(a).tobytes() == c.tobytes() for a, c in zip(again, chunks))


def test_default_zstd_store_is_decoded_on_the_host_many_chunks_at_once(cluster, tmp_path):
    """zarr's defaults (zstd, one frame per chunk, no shards): ``cluster.open`` reads the
    chunks in the host-decode pool, several at once on the one worker, to zarr's bits."""
    import zarr

    from spillway.workflows.zarr.chunk_files import ZSTD, chunk_files_of
    from spillway.workflows.zarr.decoded import decode_counters

    # chunks of 64 MB: each decode takes tens of milliseconds, far longer than the
    # scheduler's round trip that hands the worker its next read after a secede
    shape, chunks = (8 * 64, 512, 512), (64, 512, 512)
    data = np.round(250 + 10 * np.random.default_rng(5).standard_normal(shape), 2).astype(np.float32)
    z = zarr.create_array(str(tmp_path / "d.zarr"), shape=shape, chunks=chunks, dtype="float32")
    z[...] = data
    assert chunk_files_of(z).encoding == ZSTD and not chunk_files_of(z).gpu_decodes()
    before = cluster.client.run(decode_counters)
    got = cluster.compute(cluster.open(str(tmp_path / "d.zarr")))
    after = cluster.client.run(decode_counters)
    assert type(got).__module__.startswith("cupy") and got.get().tobytes() == data.tobytes()
    decoded = sum(after[w]["stages"]["decode"]["bytes"] - before[w]["stages"]["decode"]["bytes"] for w in after)
    copied = sum(after[w]["stages"]["copy"]["bytes"] - before[w]["stages"]["copy"]["bytes"] for w in after)
    assert decoded == copied == data.nbytes
    buffers = [a["host_buffers"] for a in after.values()]
    assert all(b["in_use"] == 0 for b in buffers)  # every decode buffer handed back
    # the read tasks seceded: the one worker thread had several chunk reads in flight
    assert max(b["reads_in_flight_peak"] for b in buffers) >= 2


def test_default_store_chunks_stream_to_the_device_piece_by_piece(tmp_path, monkeypatch):
    """In this process, the pool: chunks of one zstd frame are decoded while read and each
    piece copied to the device as it is decoded (pieces of 1 MiB, chunks of 6.5 MB and a
    cut edge chunk): zarr's bits on the device, no chunk-sized host buffer, the read,
    decode and copy stages counted once per chunk."""
    cupy = pytest.importorskip("cupy")
    pytest.importorskip("zstandard")
    import zarr

    from spillway_bench.zarr.defaults import field_block
    from spillway.workflows.zarr import host_decode, read
    from spillway.workflows.zarr.chunk_files import chunk_files_of
    from spillway.workflows.zarr.decoded import decode_counters

    monkeypatch.setitem(dask.config.config["spillway"], "zarr-decode-threads", 4)
    monkeypatch.setitem(dask.config.config["spillway"], "zarr-decode-piece-bytes", 2**20)
    host_decode.close()
    data = field_block(0, 70, 181, 360)  # chunks of 25 days: 6.5 MB; the last one 20 days
    z = zarr.create_array(str(tmp_path / "d.zarr"), shape=data.shape, chunks=(25, 181, 360), dtype="float32")
    z[...] = data
    files = chunk_files_of(z)
    try:
        assert host_decode.decoder().streams
        before = decode_counters()["stages"]

        def chunk(i):
            return lambda io: read.read_direct(files, (i, 0, 0), (min(25, 70 - 25 * i), 181, 360), io)

        got = [host_decode.read_in_pool(chunk(i), need=host_decode.bytes_to_read(files, (i, 0, 0), to_device=True))
               for i in range(3)]
        after = decode_counters()
    finally:
        host_decode.close()
    assert all(isinstance(g, cupy.ndarray) for g in got)
    assert cupy.asnumpy(cupy.concatenate(got)).tobytes() == data.tobytes()
    for stage in ("decode", "copy"):
        assert after["stages"][stage]["bytes"] - before[stage]["bytes"] == 3 * files.chunk_bytes
        assert after["stages"][stage]["calls"] - before[stage]["calls"] == 3
    assert after["host_buffers"]["peak"] < files.chunk_bytes  # pieces and windows, never a chunk
