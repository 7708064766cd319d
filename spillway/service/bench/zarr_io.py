"""``spillway bench --zarr``: writing and reading Zarr v3 stores from the cluster's
workers, against the disk and host-copy ceilings of the same run.

The store is shaped like a daily climate record: float32 days x 721 x 1440 (a 0.25
degree grid), one chunk per 365 days (1.5 GB), 100 GB at ``--sizes full`` and 12 GB at
``small``; ``tiny`` (the CPU default) is a 2.5 degree grid of 61 MB. Values are seeded
uniform numbers kept to 0.001, as stored records keep a fixed precision (so that zstd has
something to compress, as it has in real data). Two stores are written from the same
chunks and read back, each in turn (so the disk holds one at a time):

* ``uncompressed``: spillway's own output path (:mod:`spillway.workflows.zarr_io`: uncompressed
  chunks, written from device memory with KvikIO on GPU workers);
* ``zstd``: what GPU reads of compressed data want, through the user's path (dask's
  ``store`` into a zarr array, zarr's CPU zstd encoder; CuPy chunks reach zarr through
  :mod:`spillway.workflows.zarr_buffers`): shards of 365 days, each day cut into bands of rows of
  at most 1 MiB, each band an inner chunk of its own zstd frame, so a shard is thousands
  of frames that nvCOMP decodes in one batch.

Each store is measured three ways, each read checked bit for bit against what was
written:

* ``write``: from persisted chunks to files, until the files are on disk (``fsync``),
  against the ``disk_write`` ceiling;
* ``cold read``: with the store's pages dropped from the page cache first (as the
  ``disk_read`` ceiling drops its own), against ``disk_read``; target 70% of it. For the
  zstd store the ratio is of the bytes that crossed the disk (stored bytes);
* ``cached read``: with the store in the page cache, against the pinned host -> GPU copy
  of every GPU of the run (``host_copy`` on CPU workers); target 10 GB/s per host of
  array (decoded) bytes.

GB/s are of array bytes (decoded) unless said. The zstd reads also give the **GPU decode
rate**: bytes nvCOMP decoded per second spent decoding (until its stream finished), per
GPU, from the workers' counters; target 5 GB/s.

The store lies in ``--local-directory`` (the system's temporary directory without it),
where the disk ceilings are measured too, and is removed afterwards. Files go to
``<out>/<machine>-<date>-zarr[-<label>].{json,md,png}``.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ..errors import ParamError
from ..gpus import Inventory
from ..launch.plan import host_memory_bytes
from ..options import Options
from ..sizes import format_bytes
from . import ceilings, report

#: (grid, days) by size: one chunk is 365 days of the grid
SCALES = {
    "tiny": ((73, 144), 4 * 365),
    "small": ((721, 1440), 8 * 365),
    "full": ((721, 1440), 66 * 365),  # 100.1 GB
}
CHUNK_DAYS = 365
DTYPE = "float32"
#: the issue's targets
CACHED_TARGET_GBPS = 10.0
COLD_TARGET = 0.7
DECODE_TARGET_GBPS = 5.0
#: the values' precision (module docstring)
QUANTUM = 1e-3
#: the zstd store: an inner chunk (one zstd frame) is a day's rows, cut into as few
#: equal bands as keep it within this size: a 0.25 degree day (4.2 MB) is 7 bands of 103
#: rows (0.6 MB), so a shard is 2555 frames, which nvCOMP decodes in one batch; each band
#: is a contiguous slab of the shard, decoded in place
ZSTD_FRAME_BYTES = 2**20
STORES = ("uncompressed", "zstd")
#: share of the workers' memory the store may take (it is held whole once read), and
#: of the free disk space
MEMORY_SHARE = {"gpu": 0.6, "cpu": 0.3}
DISK_SHARE = 0.9
MEASURES = ("write", "cold_read", "cached_read")


@dataclass(frozen=True)
class ZarrPlan:
    options: Options
    kind: str
    devices: tuple
    inventory: Inventory | None
    scale: str
    runs: int
    timeout: float
    directory: str
    label: str | None = None
    measure_ceilings: Callable = field(default=ceilings.measure)

    @property
    def shape(self) -> tuple[int, int, int]:
        (lat, lon), days = SCALES[self.scale]
        return (days, lat, lon)

    @property
    def chunks(self) -> tuple[int, int, int]:
        return (CHUNK_DAYS, *self.shape[1:])

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(DTYPE).itemsize

    @property
    def chunk_bytes(self) -> int:
        return math.prod(self.chunks) * np.dtype(DTYPE).itemsize

    @property
    def zstd_inner(self) -> tuple[int, int, int]:
        """The zstd store's inner chunk (see ZSTD_FRAME_BYTES)."""
        _, lat, lon = self.shape
        row = lon * np.dtype(DTYPE).itemsize
        bands = next((k for k in range(1, lat + 1) if lat % k == 0 and (lat // k) * row <= ZSTD_FRAME_BYTES), lat)
        return (1, lat // bands, lon)


def prepare_zarr(options: Options, *, sizes: str = "auto", runs: int = 3, timeout: float = 900,
                 label: str | None = None, inventory: Inventory | None = None,
                 no_ceilings: bool = False) -> ZarrPlan:
    """Check the request and plan the run: one-line errors before anything starts."""
    from . import checked_launch

    label, inventory, launch, options, scale = checked_launch(
        options, sizes=sizes, runs=runs, label=label, inventory=inventory,
        no_attach="the Zarr bench measures this machine's disk", scales=SCALES)
    directory = options.local_directory or tempfile.gettempdir()
    plan = ZarrPlan(options=options, kind=launch.kind, devices=tuple(launch.devices), inventory=inventory,
                    scale=scale, runs=runs, timeout=timeout, directory=directory, label=label,
                    **({"measure_ceilings": ceilings.not_measured} if no_ceilings else {}))
    free = shutil.disk_usage(directory).free
    # both stores lie on the disk at once; the zstd one is counted as large as the other
    if 2 * plan.nbytes > DISK_SHARE * free:
        raise ParamError(f"sizes: the {scale} stores take up to {format_bytes(2 * plan.nbytes)}, more than "
                         f"{DISK_SHARE:.0%} of the {format_bytes(free)} free in {directory} (--local-directory)")
    if launch.kind == "gpu":
        memory = sum(g.memory_total for g in inventory.gpus if g.index in launch.devices)
        where = f"the {len(launch.devices)} GPUs' {format_bytes(memory)}"
    else:
        memory = host_memory_bytes()
        where = f"this host's {format_bytes(memory)}"
    share = MEMORY_SHARE[launch.kind]
    if memory and plan.nbytes > share * memory:
        raise ParamError(f"sizes: the {scale} store ({format_bytes(plan.nbytes)}) is read whole into the workers' "
                         f"memory, more than {share:.0%} of {where}")
    return plan


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


def _io_path(dask_worker=None) -> dict:
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


def zstd_array(path: str, plan: ZarrPlan):
    """The zstd store, created (metadata only): shards of a chunk, inner chunks of
    ``plan.zstd_inner``, zarr's default zstd (level 0, no checksum)."""
    import zarr

    return zarr.create_array(store=path, shape=plan.shape, chunks=plan.zstd_inner, shards=plan.chunks, dtype=DTYPE,
                             zarr_format=3, compressors=zarr.codecs.ZstdCodec(level=0, checksum=False),
                             overwrite=True)


def stored_bytes(path: str) -> int:
    return sum(os.path.getsize(f) for f in store_files(path))


def measure_zarr(plan: ZarrPlan, client, directory: str, *, log: Callable[[str], None]) -> dict:
    """For each store: write, then read cold and cached ``plan.runs`` times each; seconds
    per run, whether every read gave the written bits, the bytes stored, and (zstd) what
    the workers decoded on the GPU and on the host."""
    import dask.array as da
    from distributed import wait

    from spillway.workflows import random, zarr as zarr_io
    from spillway.workflows.backend import backend_for

    from .harness import synchronize_device, wait_released

    backend = backend_for(plan.kind)

    def settle():
        if plan.kind == "gpu":
            client.run(synchronize_device)

    def decoded():
        return client.run(zarr_io.decode_counters)

    source = random.uniform(plan.shape, plan.chunks, seed=0, dtype=DTYPE, backend=backend)
    source = client.persist(source.map_blocks(_quantize, dtype=source.dtype))
    wait(source, timeout=plan.timeout)
    expected = int(client.compute(fingerprint(source)).result(timeout=plan.timeout))

    def write(name: str, path: str) -> dict:
        t0 = time.perf_counter()
        if name == "uncompressed":
            graph = zarr_io.store(source, path)
        else:
            graph = da.store(source, zstd_array(path, plan), lock=False, compute=False)
        client.compute(graph).result(timeout=plan.timeout)
        settle()
        unsynced = time.perf_counter() - t0
        sync_and_drop(path)
        seconds = time.perf_counter() - t0
        log(f"zarr {name:<12} write        {format_bytes(plan.nbytes)} in {seconds:.2f} s "
            f"({unsynced:.2f} s before fsync)")
        return {"runs": [{"seconds": seconds, "seconds_before_fsync": unsynced, "bits_equal": True}]}

    def read(name: str, path: str, label: str, prepare: Callable[[], None]) -> list[dict]:
        runs = []
        for i in range(plan.runs):
            prepare()
            start = time.perf_counter()
            array = client.persist(zarr_io.open_array(path, backend))
            wait(array, timeout=plan.timeout)
            settle()
            seconds = time.perf_counter() - start
            same = int(client.compute(fingerprint(array)).result(timeout=plan.timeout)) == expected
            del array
            wait_released(client)
            runs.append({"seconds": seconds, "bits_equal": same})
            log(f"zarr {name:<12} {label:<12} run {i + 1}: {seconds:.3f} s ({plan.nbytes / seconds / 1e9:.2f} GB/s)"
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


def ceiling_of(name: str, kind: str, gbps: dict, n_gpus: int) -> tuple[str | None, float | None]:
    """The ceiling each measurement is read against, and its GB/s."""
    if name == "write":
        return "disk_write", gbps.get("disk_write")
    if name == "cold_read":
        return "disk_read", gbps.get("disk_read")
    if kind == "gpu":
        h2d = gbps.get("h2d_pinned")
        return f"h2d_pinned x {n_gpus} GPUs", h2d * n_gpus if h2d else None
    return "host_copy", gbps.get("host_copy")


def summarize(measured: dict, *, nbytes: int, kind: str, gbps: dict, n_gpus: int) -> dict:
    """Per store: median seconds, GB/s (array bytes; and of stored bytes), against the
    ceilings; for zstd, the compression ratio and the decode rates."""
    out = {}
    for store, m in measured.items():
        stored = m.get("stored_bytes") or nbytes
        entry = {"stored_bytes": stored, "ratio": nbytes / stored if stored else None}
        for name in MEASURES:
            runs = m[name]["runs"]
            seconds = statistics.median(r["seconds"] for r in runs)
            ceiling, value = ceiling_of(name, kind, gbps, n_gpus)
            rate = nbytes / seconds / 1e9
            # the disk moves stored bytes: a compressed store is judged on those
            moved = stored / seconds / 1e9 if name != "cached_read" else rate
            entry[name] = {**m[name], "seconds": seconds, "gbps": rate, "stored_gbps": stored / seconds / 1e9,
                           "ceiling": ceiling, "ceiling_gbps": value,
                           "ratio_to_ceiling": moved / value if value else None,
                           "bits_equal": all(r["bits_equal"] for r in runs)}
        decoded = m.get("decoded")
        if decoded is not None and store != "uncompressed":
            entry["decode"] = {where: {**d, "gbps_per_worker": d["bytes"] / d["seconds"] / 1e9 if d["seconds"] else None}
                               for where, d in decoded.items()}
        out[store] = entry
    return out


def targets(stores: dict, kind: str) -> list[dict]:
    """The issue's targets, per store; met is null on CPU workers (they are the GPU host's)."""
    out = []
    judged = kind == "gpu"
    for store, s in stores.items():
        cached = s["cached_read"]["gbps"]
        cold = s["cold_read"]["ratio_to_ceiling"]
        out += [
            {"store": store, "target": f"{store}: page-cached read into device chunks >= {CACHED_TARGET_GBPS:.0f} GB/s "
                                       "per host", "value": cached, "unit": "GB/s",
             "met": None if not judged else cached >= CACHED_TARGET_GBPS},
            {"store": store, "target": f"{store}: cold read >= {COLD_TARGET:.0%} of the disk read ceiling",
             "value": cold, "unit": "ratio", "met": None if not judged or cold is None else cold >= COLD_TARGET},
        ]
        if "decode" in s:
            gpu = s["decode"]["gpu"]["gbps_per_worker"]
            out.append({"store": store, "target": f"{store}: decoded on the GPU >= {DECODE_TARGET_GBPS:.0f} GB/s per GPU",
                        "value": gpu, "unit": "GB/s",
                        "met": None if not judged else (gpu is not None and gpu >= DECODE_TARGET_GBPS)})
    return out


def run_zarr_bench(plan: ZarrPlan, out_dir: Path, *, stream=sys.stderr) -> tuple[dict, dict[str, Path]]:
    """Measure the ceilings, start spillway's cluster, write and read; then write the
    JSON, markdown and plot. Returns the results and the paths."""
    from ..launch import open_cluster

    machine = report.describe_machine(plan.inventory, plan.kind)
    started = datetime.now(timezone.utc)

    def log(message: str) -> None:
        if stream is not None:
            print(message, file=stream, flush=True)

    log(f"spillway bench --zarr on {machine['name']}: {format_bytes(plan.nbytes)} float32 "
        f"{'x'.join(map(str, plan.shape))} in {format_bytes(plan.chunk_bytes)} chunks, in {plan.directory}")
    measured_ceilings = plan.measure_ceilings(plan.kind, plan.devices, plan.chunk_bytes, log=log,
                                              directory=plan.directory)
    path = tempfile.mkdtemp(prefix="spillway-zarr-bench-", dir=plan.directory)
    try:
        with open_cluster(plan.options, inventory=plan.inventory) as session:
            client = session.client
            io_paths = client.run(_io_path) if plan.kind == "gpu" else {}
            measured = measure_zarr(plan, client, path, log=log)
            cluster = {"kind": session.kind, "n_workers": session.n_workers}
    finally:
        shutil.rmtree(path, ignore_errors=True)
    n_gpus = len(plan.devices) if plan.kind == "gpu" else 0
    stores = summarize(measured, nbytes=plan.nbytes, kind=plan.kind, gbps=measured_ceilings.gbps, n_gpus=n_gpus)
    results = {
        "what": "zarr write and read",
        "machine": machine,
        "label": plan.label,
        "workers": plan.kind,
        "cluster": cluster,
        "io_path": sorted({p["mode"] + (f", {p['threads']} threads" if p.get("threads") else "")
                           + (", nvCOMP zstd" if p.get("nvcomp") else "") for p in io_paths.values()})
        or ["zarr on the host (NumPy chunks)"],
        "sizes": plan.scale,
        "runs": plan.runs,
        "shape": list(plan.shape),
        "chunks": list(plan.chunks),
        "zstd_inner_chunks": list(plan.zstd_inner),
        "dtype": DTYPE,
        "bytes": plan.nbytes,
        "directory": plan.directory,
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "ceilings": dict(measured_ceilings.gbps),
        "ceilings_skipped": dict(measured_ceilings.skipped),
        "stores": stores,
        "targets": targets(stores, plan.kind),
    }
    name = report.stem(machine, started, "zarr" + (f"-{plan.label}" if plan.label else ""))
    paths = report.write(results, out_dir, name, render=markdown, draw=plot)
    for p in paths.values():
        log(f"wrote {p}")
    return results, paths


# --- rendering


def _rows(results: dict) -> list[list[str]]:
    rows = [["store", "", "s (median)", "GB/s", "stored GB/s", "ceiling", "of ceiling", "bits"]]
    for store, st in results["stores"].items():
        for name in MEASURES:
            m = st[name]
            ceiling = "—" if m["ceiling_gbps"] is None else f"{m['ceiling']} {m['ceiling_gbps']:.1f}"
            ratio = "—" if m["ratio_to_ceiling"] is None else f"{100 * m['ratio_to_ceiling']:.0f}%"
            rows.append([store, name.replace("_", " "), f"{m['seconds']:.3f}", f"{m['gbps']:.2f}",
                         f"{m['stored_gbps']:.2f}", ceiling, ratio, "equal" if m["bits_equal"] else "DIFFER"])
    return rows


def _decode_lines(results: dict) -> list[str]:
    lines = []
    for store, st in results["stores"].items():
        for where, d in st.get("decode", {}).items():
            if d["frames"]:
                rate = "—" if d["gbps_per_worker"] is None else f"{d['gbps_per_worker']:.2f} GB/s per worker"
                lines.append(f"{store}: decoded on the {where}: {format_bytes(d['bytes'])} in {d['frames']} frames, "
                             f"{d['seconds']:.2f} s, {rate} ({d['workers']} workers)")
        if store != "uncompressed" and st.get("ratio"):
            lines.append(f"{store}: {format_bytes(st['stored_bytes'])} stored, ratio {st['ratio']:.2f}")
    return lines


def _value(t: dict) -> str:
    if t["value"] is None:
        return "—"
    return f"{t['value']:.2f} GB/s" if t["unit"] == "GB/s" else f"{100 * t['value']:.0f}%"


def short_table(results: dict) -> str:
    rows = _rows(results)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(widths[i]) if i in (0, 1, 5) else c.rjust(widths[i]) for i, c in enumerate(r))
             for r in rows]
    lines += _decode_lines(results)
    for t in results["targets"]:
        met = "not judged (CPU workers)" if t["met"] is None else ("met" if t["met"] else "NOT met")
        lines.append(f"target: {t['target']}: {_value(t)}, {met}")
    return "\n".join(lines)


def markdown(results: dict) -> str:
    m = results["machine"]
    gpus = ", ".join(f"{g['name']} ({format_bytes(g['memory_total'])})" for g in m["gpus"]) or "none"
    rows = _rows(results)
    inner = "x".join(map(str, results["zstd_inner_chunks"]))
    lines = [
        f"# spillway bench --zarr: {m['name']}",
        "",
        f"- started {results['started']}, finished {results['finished']}",
        *([f"- label `{results['label']}`"] if results.get("label") else []),
        f"- stores: {format_bytes(results['bytes'])} {results['dtype']} {'x'.join(map(str, results['shape']))}, "
        f"chunks {'x'.join(map(str, results['chunks']))}: `uncompressed` (spillway's output path), and `zstd` "
        f"(shards of that size, inner chunks {inner} each its own zstd frame, written by zarr); in "
        f"`{results['directory']}`; sizes `{results['sizes']}`, {results['runs']} runs of each read, median shown",
        f"- workers: {results['cluster']['n_workers']} {results['workers']}; GPUs: {gpus}; "
        f"driver {m['driver_version']}, CUDA {m['cuda_driver_version']}",
        f"- chunk I/O: {'; '.join(results['io_path'])}",
        f"- CPU: {m['cpu']}, {m['cores']} cores, {format_bytes(m['memory_total'])}",
        "- stack: " + ", ".join(f"{k} {v}" for k, v in m["stack"].items() if v),
        "",
        "Write: until the files are on disk (fsync). Cold read: the store's pages dropped first. Cached read: "
        "the store in the page cache. GB/s are 10^9 array (decoded) bytes per second; stored GB/s count the bytes "
        "in the files, and the disk ceilings are judged on those. Every read is checked bit for bit against what "
        "was written.",
        "",
        "| " + " | ".join(rows[0]) + " |",
        "| --- | --- |" + " ---: |" * 3 + " --- | ---: | --- |",
        *("| " + " | ".join(r) + " |" for r in rows[1:]),
        "",
        *(f"- {line}" for line in _decode_lines(results)),
        "",
        "## Targets",
        "",
        "| target | value | met |",
        "| --- | ---: | --- |",
    ]
    for t in results["targets"]:
        lines.append(f"| {t['target']} | {_value(t)} | "
                     f"{'not judged (CPU workers)' if t['met'] is None else 'yes' if t['met'] else 'no'} |")
    lines += ["", "## Ceilings", "", "| ceiling | GB/s |", "| --- | ---: |"]
    lines += [f"| {k} | {v:.1f} |" for k, v in results["ceilings"].items()]
    lines += [f"| {k} | skipped: {why} |" for k, why in results["ceilings_skipped"].items()]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(store, n) for store in results["stores"] for n in MEASURES]
    names = [f"{store}\n{n.replace('_', ' ')}" for store, n in bars]
    measured = [results["stores"][s][n]["gbps"] for s, n in bars]
    limits = [results["stores"][s][n]["ceiling_gbps"] for s, n in bars]
    x = np.arange(len(bars))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ax.bar(x - 0.2, measured, width=0.4, label="spillway (array bytes)")
    ax.bar(x + 0.2, [v or 0 for v in limits], width=0.4, label="ceiling", color="lightgray", edgecolor="gray")
    for i, (s, n) in enumerate(bars):
        ratio = results["stores"][s][n]["ratio_to_ceiling"]
        if ratio is not None:
            ax.annotate(f"{100 * ratio:.0f}%", (i - 0.2, measured[i]), ha="center", va="bottom", fontsize=8)
        if limits[i]:
            ax.annotate(results["stores"][s][n]["ceiling"], (i + 0.2, limits[i]), ha="center", va="bottom",
                        fontsize=7)
    if results["workers"] == "gpu":
        ax.axhline(CACHED_TARGET_GBPS, color="black", linestyle="--", linewidth=1,
                   label=f"cached-read target {CACHED_TARGET_GBPS:.0f} GB/s")
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel("GB/s")
    ax.legend()
    label = f", {results['label']}" if results.get("label") else ""
    ax.set_title(f"Zarr {format_bytes(results['bytes'])} on {results['machine']['name']} "
                 f"({results['sizes']}{label})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
