"""One Zarr bench run: the ceilings, spillway's cluster writing and reading the stores,
and the measurements against the ceilings and the targets."""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from spillway.options.sizes import format_bytes

from .. import report
from ..formatting import fmt_shape, stream_log
from .measure import io_path, measure_zarr
from .prepare import CACHED_TARGET_GBPS, COLD_TARGET, DECODE_TARGET_GBPS, DTYPE, MEASURES, ZarrRun
from .render import markdown, plot

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


def run_zarr_bench(zarr_run: ZarrRun, out_dir: Path, *, stream=sys.stderr) -> tuple[dict, dict[str, Path]]:
    """Measure the ceilings, start spillway's cluster, write and read; then write the
    JSON, markdown and plot. Returns the results and the paths."""
    from spillway.launch import open_cluster

    machine = report.describe_machine(zarr_run.inventory, zarr_run.kind)
    started = datetime.now(timezone.utc)

    log = stream_log(stream)
    log(f"spillway bench --zarr on {machine['name']}: {format_bytes(zarr_run.nbytes)} float32 "
        f"{fmt_shape(zarr_run.shape)} in {format_bytes(zarr_run.chunk_bytes)} chunks, in {zarr_run.directory}")
    measured_ceilings = zarr_run.measure_ceilings(zarr_run.kind, zarr_run.devices, zarr_run.chunk_bytes, log=log,
                                              directory=zarr_run.directory)
    path = tempfile.mkdtemp(prefix="spillway-zarr-bench-", dir=zarr_run.directory)
    try:
        with open_cluster(zarr_run.options, inventory=zarr_run.inventory) as session:
            client = session.client
            io_paths = client.run(io_path) if zarr_run.kind == "gpu" else {}
            measured = measure_zarr(zarr_run, client, path, log=log)
            cluster = {"kind": session.kind, "n_workers": session.n_workers}
            if session.kind == "gpu":
                cluster["workers_per_gpu"] = session.plan.workers_per_gpu
    finally:
        shutil.rmtree(path, ignore_errors=True)
    n_gpus = len(set(zarr_run.devices)) if zarr_run.kind == "gpu" else 0  # a GPU once per worker of it
    stores = summarize(measured, nbytes=zarr_run.nbytes, kind=zarr_run.kind, gbps=measured_ceilings.gbps, n_gpus=n_gpus)
    results = {
        "what": "zarr write and read",
        "machine": machine,
        "label": zarr_run.label,
        "workers": zarr_run.kind,
        "cluster": cluster,
        "io_path": sorted({p["mode"] + (f", {p['threads']} threads" if p.get("threads") else "")
                           + (", nvCOMP zstd" if p.get("nvcomp") else "") for p in io_paths.values()})
        or ["zarr on the host (NumPy chunks)"],
        "sizes": zarr_run.scale,
        "runs": zarr_run.runs,
        "shape": list(zarr_run.shape),
        "chunks": list(zarr_run.chunks),
        "zstd_inner_chunks": list(zarr_run.zstd_inner),
        "dtype": DTYPE,
        "bytes": zarr_run.nbytes,
        "directory": zarr_run.directory,
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "ceilings": dict(measured_ceilings.gbps),
        "ceilings_skipped": dict(measured_ceilings.skipped),
        "stores": stores,
        "targets": targets(stores, zarr_run.kind),
    }
    name = report.stem(machine, started, "zarr" + (f"-{zarr_run.label}" if zarr_run.label else ""))
    paths = report.write(results, out_dir, name, render=markdown, draw=plot)
    for p in paths.values():
        log(f"wrote {p}")
    return results, paths
