"""Where a GPU worker's host memory goes during a run past the GPU: the tiered store's books
beside what the kernel says the worker process holds.

    python3 benchmarks/gpu-host/host-books.py WORKFLOW K=V ... [--every 2] [--log FILE]

Starts ``spillway.local()`` with the defaults, runs WORKFLOW with ``verify=True`` on a thread,
and every ``--every`` seconds reads on each worker: the store's host tier and disk bytes, its
pinned arena and on-demand pinned and pageable bytes, CuPy's pinned pool, and the process's
RssAnon / RssShmem / RssFile; and MemAvailable. Prints one line per sample, then the run's
result or error.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time


def probe(dask_worker) -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssShmem", "RssFile", "VmRSS"):
                out[name] = int(value.split()[0]) << 10
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                out["avail"] = int(line.split()[1]) << 10
    store = dask_worker.data
    summary = getattr(store, "summary", None)
    if summary is not None:
        s = summary()
        out.update(host=s["host_bytes"], disk=s["disk_bytes"], device=s["device_bytes"],
                   arena=s["host"]["arena_bytes"], arena_used=s["host"]["arena_used_bytes"],
                   ondemand=s["host_pinned_on_demand_bytes"], pageable_total=s["host_pageable_total"])
        books = s.get("books")
        if books:
            out.update({f"b_{k}": v for k, v in books.items() if isinstance(v, (int, float))})
    try:
        import cupy

        pool = cupy.get_default_pinned_memory_pool()
        out["cupy_pinned_free_blocks"] = pool.n_free_blocks()
    except Exception:
        pass
    out["paused"] = str(dask_worker.status)
    out["executing"] = len(dask_worker.state.executing)
    return out


def main() -> int:
    import spillway

    p = argparse.ArgumentParser()
    p.add_argument("workflow")
    p.add_argument("params", nargs="*")
    p.add_argument("--every", type=float, default=2.0)
    p.add_argument("--option", action="append", default=[], help="K=V passed to spillway.local")
    args = p.parse_args()
    params = {}
    for kv in args.params:
        k, _, v = kv.partition("=")
        params[k] = v
    options = {}
    for kv in args.option:
        k, _, v = kv.partition("=")
        options[k] = v
    g = lambda v: f"{v / 2**30:6.1f}" if isinstance(v, (int, float)) else "     -"
    with spillway.local(**options) as cluster:
        client = cluster.client
        done = threading.Event()
        result = {}

        def run():
            try:
                result["report"] = cluster.run(args.workflow, params, verify=True, progress=False)
            except BaseException as e:  # noqa: BLE001 - reported below
                result["error"] = f"{type(e).__name__}: {e}"
            finally:
                done.set()

        t0 = time.time()
        threading.Thread(target=run, daemon=True).start()
        print("   t  worker: avail  anon shmem  file | host  disk   dev arena used ondem | status", flush=True)
        while not done.wait(args.every):
            try:
                snaps = client.run(probe, wait=True)
            except Exception as e:  # noqa: BLE001
                print(f"{time.time() - t0:5.0f}  probe failed: {e}", flush=True)
                continue
            for addr, s in snaps.items():
                print(f"{time.time() - t0:5.0f} {addr[-5:]}: {g(s.get('avail'))} {g(s.get('RssAnon'))} "
                      f"{g(s.get('RssShmem'))} {g(s.get('RssFile'))} | {g(s.get('host'))} {g(s.get('disk'))} "
                      f"{g(s.get('device'))} {g(s.get('arena'))} {g(s.get('arena_used'))} {g(s.get('ondemand'))} "
                      f"| {s.get('paused')} x{s.get('executing')} "
                      + " ".join(f"{k}={g(v)}" for k, v in s.items() if k.startswith("b_")), flush=True)
        print(f"wall {time.time() - t0:.1f} s")
        if "error" in result:
            print("ERROR", result["error"])
            return 1
        report = result["report"]
        print("verify", report["verify"])
        return 0


if __name__ == "__main__":
    sys.exit(main())
