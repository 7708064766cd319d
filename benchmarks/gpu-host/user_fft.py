"""A user's FFT-rechunk-FFT past the GPUs' memory, as issue 60 measured it: a persisted
N x N float64 field in column panels, ``da.fft.fft`` along axis 0, ``.rechunk`` to row
panels, ``da.fft.fft`` along axis 1, the result persisted. Its peak (the field, the
transforms and the rechunk in flight, the result held) is past the GPUs' memory.

    python3 benchmarks/gpu-host/user_fft.py --side spillway [--method tasks] [--n 100000]
        [--panel 1000] [--idle 60] [--workload fft|rechunk] [--out result.json]

``--workload rechunk``: the user's plain rechunk instead, a persisted float64 field in row
panels to column panels, persisted beside it (checked by the sum and a window).

``--side spillway`` starts ``spillway.local()`` with its defaults (``--method tasks``: the
user set ``array.rechunk.method: tasks`` first); ``--side dask-cuda`` a plain
``LocalCUDACluster(protocol="ucx")``. One run on the fresh cluster (its first), then, with
``--idle S``, one more after the cluster sat idle S seconds. Each run has keys of its own
and waits until the previous result is released. Rows 0 and K of the result are checked
against NumPy float64 (row k of the first transform is the field's columns weighted by
exp(-2 pi i k j / N), summed on the cluster without the rechunk; its FFT on the host is
the expected row). Prints one line per step and the JSON last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

GB = 1e9


def _spill_totals(client) -> dict | None:
    try:
        from spillway.launch.plugins import worker_snapshot

        snaps = client.run(worker_snapshot)
    except Exception:  # noqa: BLE001 (a plain dask-cuda worker has no spillway plugin)
        return None
    out: dict = {}
    for snap in snaps.values():
        for move, nbytes in (snap.get("spilled") or {}).items():
            out[move] = out.get(move, 0) + int(nbytes)
    return out


def _arena(dask_worker=None):
    host = getattr(dask_worker.data, "host", None)
    if host is None:
        return None
    s = host.summary()
    return {k: s.get(k) for k in ("arena_bytes", "arena_used_bytes", "pinned_on_demand_bytes", "pageable_total",
                                  "arena_state", "arena_take_s", "arena_pin_s", "arena_ready_s",
                                  "arena_touch_wait_s")}


def _in_memory(dask_scheduler=None) -> int:
    return sum(1 for ts in dask_scheduler.tasks.values() if ts.state == "memory")


def _released(client, base: int, timeout: float = 120) -> bool:
    """Whether the scheduler is back to ``base`` keys in memory (the field alone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.run_on_scheduler(_in_memory) <= base:
            return True
        time.sleep(0.2)
    return False


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--side", choices=("spillway", "dask-cuda"), default="spillway")
    p.add_argument("--method", choices=("default", "tasks"), default="default")
    p.add_argument("--n", type=int, default=100000)
    p.add_argument("--panel", type=int, default=1000)
    p.add_argument("--idle", type=float, default=0.0)
    p.add_argument("--check-row", type=int, default=12345)
    p.add_argument("--out", default=None)
    p.add_argument("--cpu", action="store_true", help="a dry run on CPU workers (NumPy chunks)")
    p.add_argument("--workload", choices=("fft", "rechunk"), default="fft")
    args = p.parse_args()

    import dask
    import dask.array as da
    from distributed import Client, wait

    from spillway.workflows import random

    n, panel = args.n, args.panel
    rechunk_only = args.workload == "rechunk"
    result: dict = {"side": args.side, "method": args.method, "workload": args.workload, "n": n, "panel": panel,
                    "field_gb": n * n * 8 / GB, "runs": []}

    def say(text: str) -> None:
        print(f"user-fft {args.side}/{args.method}: {text}", flush=True)

    if args.method == "tasks":
        dask.config.set({"array.rechunk.method": "tasks"})
    t0 = time.perf_counter()
    if args.side == "spillway":
        import spillway

        cluster = spillway.local(cpu=True, n_workers=2) if args.cpu else spillway.local()
        client = cluster.client
    else:
        from dask_cuda import LocalCUDACluster

        cluster = LocalCUDACluster(protocol="ucx")
        client = Client(cluster)
    result["start_s"] = time.perf_counter() - t0
    say(f"cluster up in {result['start_s']:.1f} s, {len(client.scheduler_info()['workers'])} workers")
    try:
        t0 = time.perf_counter()
        backend = "numpy" if args.cpu else "cupy"
        x = random.uniform((n, n), (panel, n) if rechunk_only else (n, panel), seed=60, dtype="float64",
                           backend=backend).persist()
        wait(x)
        result["persist_s"] = time.perf_counter() - t0
        say(f"field {result['field_gb']:.1f} GB persisted in {result['persist_s']:.1f} s")
        base = client.run_on_scheduler(_in_memory)
        runs = [("fresh", 0.0)] + ([("idle", args.idle)] if args.idle else [])
        for label, idle in runs:
            if idle:
                say(f"idle {idle:.0f} s")
                time.sleep(idle)
            before = _spill_totals(client)
            # keys of this run's own: the first transform's input is the field under a new name
            xi = x.map_blocks(lambda b: b, token=f"user-fft-{label}", meta=x._meta)
            t0 = time.perf_counter()
            if rechunk_only:
                y = None
                w = xi.rechunk((n, panel)).persist()
            else:
                y = da.fft.fft(xi, axis=0).rechunk((panel, n))
                w = da.fft.fft(y, axis=1).persist()
            wait(w)
            seconds = time.perf_counter() - t0
            after = _spill_totals(client)
            spilled = None if before is None or after is None else {
                k: after.get(k, 0) - before.get(k, 0) for k in after}
            row = {"run": label, "idle_s": idle, "seconds": seconds, "spilled": spilled,
                   "tasks": len(w.__dask_graph__()), "arena": client.run(_arena) if args.side == "spillway" else None}
            if label == "fresh":
                row["check"] = (_check_rechunk(x, w) if rechunk_only
                                else _check(client, x, w, n, min(args.check_row, n - 1)))
            result["runs"].append(row)
            moved = "" if spilled is None else " ".join(f"{k} {v / GB:.1f} GB" for k, v in spilled.items() if v)
            check = row.get("check")
            say(f"{label}: {seconds:.2f} s {moved}" + (f"; check rel err {check['rel_err']:.2e}" if check else ""))
            del w, y, xi
            if not _released(client, base):
                say("the previous result still held after 120 s")
    finally:
        try:
            client.close()
            cluster.close()
        except Exception as e:  # noqa: BLE001
            print(f"closing: {type(e).__name__}: {e}", file=sys.stderr)
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def _check(client, x, w, n: int, k: int) -> dict:
    """Rows 0 and ``k`` of the result against NumPy float64: row k of the first transform
    is sum_j x[j, :] exp(-2 pi i k j / N), made on the cluster by a weighted column sum
    (no rechunk, no FFT), then transformed on the host."""
    import dask.array as da
    import numpy as np

    from spillway.workflows.backend import to_numpy

    t0 = time.perf_counter()
    got = to_numpy(da.concatenate([w[0:1], w[k:k + 1]], axis=0).compute())
    j = da.arange(n, chunks=x.chunks[0])
    phase = da.exp(-2j * np.pi * ((k * j) % n) / n).map_blocks(_to_device, meta=x._meta.astype(np.complex128))
    sums = da.stack([x.sum(axis=0), (x * phase[:, None]).sum(axis=0)])
    rows = to_numpy(sums.compute()).astype(np.complex128)
    want = np.fft.fft(rows, axis=1)
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    return {"rows": [0, k], "rel_err": err, "ok": err < 1e-9, "seconds": time.perf_counter() - t0}


def _check_rechunk(x, w) -> dict:
    """The rechunked array against the field: their sums and a window, in float64."""
    import numpy as np

    from spillway.workflows.backend import to_numpy

    t0 = time.perf_counter()
    a, b = (float(to_numpy(v)) for v in (x.sum().compute(), w.sum().compute()))
    window = (slice(777, 1033), slice(3001, 5049))
    same = bool(np.array_equal(to_numpy(x[window].compute()), to_numpy(w[window].compute())))
    err = abs(a - b) / abs(a)
    return {"rel_err": err, "window_equal": same, "ok": same and err < 1e-12, "seconds": time.perf_counter() - t0}


def _to_device(block):
    if not _on_gpu(block):
        return block
    import cupy

    return cupy.asarray(block)


def _on_gpu(block) -> bool:
    import os

    return bool(os.environ.get("CUDA_VISIBLE_DEVICES"))


if __name__ == "__main__":
    sys.exit(main())
