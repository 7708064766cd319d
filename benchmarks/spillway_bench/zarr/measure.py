"""What the workers run: the stores written and read back, each read checked bit for bit,
with the page cache dropped (cold) or filled (cached) first."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable

import numpy as np

from spillway.options.sizes import format_bytes

from .. import ceilings
from .prepare import DTYPE, QUANTUM, STORES, ZarrRun

# --- what the workers run


def _fingerprint_block(block):
    """The sum of a block's bit patterns as unsigned integers, modulo 2**64: equal for
    equal bits whatever the order of the sum."""
    from spillway.workflows.backend import module_of

    xp = module_of(block)
    bits = block.view(np.dtype(f"u{block.dtype.itemsize}"))
    total = int(xp.sum(bits, dtype=xp.uint64))
    return np.full((1,) * block.ndim, total, dtype=np.uint64)


def fingerprint(array):
    """A lazy uint64 that changes when any bit of ``array`` does."""
    ones = tuple((1,) * len(c) for c in array.chunks)
    blocks = array.map_blocks(_fingerprint_block, chunks=ones, dtype=np.uint64,
                              meta=np.empty((0,) * array.ndim, dtype=np.uint64))
    return blocks.sum(dtype=np.uint64)


def io_path(dask_worker=None) -> dict:
    from spillway.workflows import zarr as zarr_io

    return zarr_io.describe()


# --- the page cache


def store_files(path: str) -> list[str]:
    return [os.path.join(d, n) for d, _, names in os.walk(path) for n in names]


def sync_and_drop(path: str) -> None:
    """Every file of the store on disk and out of the page cache."""
    for f in store_files(path):
        ceilings._sync_and_drop(f)


def warm(path: str) -> None:
    """Every file of the store read once, so the page cache holds it."""
    buffer = bytearray(64 * 2**20)
    for f in store_files(path):
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buffer):
                pass


# --- the run


def _quantize(block):
    from spillway.workflows.backend import module_of

    xp = module_of(block)
    return (xp.round(block / QUANTUM) * QUANTUM).astype(block.dtype)


def zstd_array(path: str, zarr_run: ZarrRun):
    """The zstd store, created (metadata only): shards of a chunk, inner chunks of
    ``zarr_run.zstd_inner``, zarr's default zstd (level 0, no checksum)."""
    import zarr

    return zarr.create_array(store=path, shape=zarr_run.shape, chunks=zarr_run.zstd_inner, shards=zarr_run.chunks,
                             dtype=DTYPE, zarr_format=3, compressors=zarr.codecs.ZstdCodec(level=0, checksum=False),
                             overwrite=True)


def stored_bytes(path: str) -> int:
    return sum(os.path.getsize(f) for f in store_files(path))


def measure_zarr(zarr_run: ZarrRun, client, directory: str, *, log: Callable[[str], None]) -> dict:
    """For each store: write, then read cold and cached ``zarr_run.runs`` times each; seconds
    per run, whether every read gave the written bits, the bytes stored, and (zstd) what
    the workers decoded on the GPU and on the host."""
    import dask.array as da
    from distributed import wait

    from spillway.run import measuring
    from spillway.workflows import random
    from spillway.workflows import zarr as zarr_io
    from spillway.workflows.backend import chunk_backend_for

    from ..measure import synchronize_device, wait_released

    backend = chunk_backend_for(zarr_run.kind)

    def settle():
        if zarr_run.kind == "gpu":
            client.run(synchronize_device)

    def decoded():
        return client.run(measuring.decode_counters)

    source = random.uniform(zarr_run.shape, zarr_run.chunks, seed=0, dtype=DTYPE, backend=backend)
    source = client.persist(source.map_blocks(_quantize, dtype=source.dtype))
    wait(source, timeout=zarr_run.timeout)
    expected = int(client.compute(fingerprint(source)).result(timeout=zarr_run.timeout))

    def write(name: str, path: str) -> dict:
        t0 = time.perf_counter()
        if name == "uncompressed":
            graph = zarr_io.store(source, path)
        else:
            graph = da.store(source, zstd_array(path, zarr_run), lock=False, compute=False)
        client.compute(graph).result(timeout=zarr_run.timeout)
        settle()
        unsynced = time.perf_counter() - t0
        sync_and_drop(path)
        seconds = time.perf_counter() - t0
        log(f"zarr {name:<12} write        {format_bytes(zarr_run.nbytes)} in {seconds:.2f} s "
            f"({unsynced:.2f} s before fsync)")
        return {"runs": [{"seconds": seconds, "seconds_before_fsync": unsynced, "bits_equal": True}]}

    def read(name: str, path: str, label: str, prepare: Callable[[], None]) -> list[dict]:
        runs = []
        for i in range(zarr_run.runs):
            prepare()
            start = time.perf_counter()
            array = client.persist(zarr_io.open_array(path, backend))
            wait(array, timeout=zarr_run.timeout)
            settle()
            seconds = time.perf_counter() - start
            same = int(client.compute(fingerprint(array)).result(timeout=zarr_run.timeout)) == expected
            del array
            wait_released(client)
            runs.append({"seconds": seconds, "bits_equal": same})
            log(f"zarr {name:<12} {label:<12} run {i + 1}: {seconds:.3f} s ({zarr_run.nbytes / seconds / 1e9:.2f} GB/s)"
                + ("" if same else "  BITS DIFFER from what was written"))
        return runs

    measured = {}
    paths = {name: os.path.join(directory, f"{name}.zarr") for name in STORES}
    for name in STORES:
        measured[name] = {"write": write(name, paths[name]), "stored_bytes": stored_bytes(paths[name])}
    del source  # the reads hold a whole store: the source goes first
    wait_released(client)
    for name in STORES:
        before = decoded()
        measured[name]["cold_read"] = {"runs": read(name, paths[name], "cold read", lambda: sync_and_drop(paths[name]))}
        measured[name]["cached_read"] = {"runs": read(name, paths[name], "cached read", lambda: warm(paths[name]))}
        measured[name]["decoded"] = _difference(before, decoded())
        shutil.rmtree(paths[name], ignore_errors=True)
    return measured


def _difference(before: dict, after: dict) -> dict:
    """Decode counters gained per worker, summed over workers per place (gpu, host);
    ``workers`` counts those that decoded there."""
    out = {}
    for where in ("gpu", "host"):
        gained = [{k: after[w][where][k] - before.get(w, {}).get(where, {}).get(k, 0) for k in ("bytes", "frames",
                                                                                                "seconds")}
                  for w in after]
        used = [g for g in gained if g["frames"]]
        out[where] = {"bytes": sum(g["bytes"] for g in used), "frames": sum(g["frames"] for g in used),
                      "seconds": sum(g["seconds"] for g in used), "workers": len(used)}
    return out
