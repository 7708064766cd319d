"""Issue 44 on one GPU: user code past device + host + disk, on ``spillway.local()`` with the
defaults, each step checked and timed, one line per step.

    python3 benchmarks/gpu-host/user-rechunk.py [--n 116000] [--panel 1000] [--budget 500]

1. ``held``: the user persists X, seeded uniform float64 (N, N) in row panels (N = 116000:
   107.6 GB, 1.35x the H100's 80 GB); the float64 reference of its sum is computed on the
   host's cores meanwhile (``spillway_bench.reference``).
2. ``refusal``: the user persists Z, more than device + host tier + disk hold beside X:
   refused before any of its tasks runs (no task of Z in the task stream), in under a
   second, with the numbers; X checked against its values after (its sum and a window).
3. ``rechunk``: the user rechunks X to column panels and persists the result beside it
   (215 GB, 2.7x the GPU). It completes (its sum and a window checked), or is refused up
   front (under a second, no rechunk task ran), or is stopped when the disk fills (the
   store's one line, within seconds of the first full write); X checked again.
4. ``disk``: the spill directories after the rechunk's result is dropped, then after X is
   dropped: the disk tier's files, bytes and what the directory holds (must be empty).
5. ``workflow``: the cluster then runs a verified workflow (transpose-sum 40000x40000).
6. ``close``: the cluster closes (user-rechunk.sh counts the tracebacks the processes print
   on stderr after the line ``user-rechunk: closing``).

Every second a thread samples the spill filesystem's free bytes and the disk tier's bytes
(``disk min free``); watch-host.sh samples the host's memory beside it. The last line is
``user-rechunk: N of M steps ok``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

SEED = 4244
GB = 1e9


def say(step: str, ok: bool | None, seconds: float, text: str) -> None:
    mark = {True: "ok", False: "FAILED", None: "--"}[ok]
    print(f"{step:<9} {mark:<6} {seconds:8.2f} s  {text}", flush=True)


def disk_state(dask_worker) -> dict:
    from spillway.memory.store import TieredStore

    store = dask_worker.data
    disk = store.disk if isinstance(store, TieredStore) else None
    if disk is None:  # the --cpu dry run: distributed's own store
        return {"directory": dask_worker.local_directory, "files": 0, "keys": len(store)}
    files = [os.path.join(disk.directory, f) for f in os.listdir(disk.directory)]
    return {"directory": disk.directory, "files": len(files), "file_bytes": sum(os.path.getsize(f) for f in files),
            "stored": disk.nbytes, "values": disk.raw_nbytes, "keys": len(store),
            "device": store.device_bytes, "host": store.host_bytes, "disk_full": store.disk_full}


class DiskWatch(threading.Thread):
    """The spill filesystem's free bytes and the disk tiers' bytes, every second."""

    def __init__(self, client):
        super().__init__(daemon=True)
        self.client = client
        self.stop = threading.Event()
        self.min_free = None
        self.max_stored = 0
        self.max_values = 0

    def run(self):
        import shutil

        while not self.stop.wait(1.0):
            try:
                states = self.client.run(disk_state)
            except Exception:  # noqa: BLE001 (the cluster closing)
                continue
            for st in states.values():
                try:
                    free = shutil.disk_usage(st["directory"]).free
                except OSError:
                    continue
                self.min_free = free if self.min_free is None else min(self.min_free, free)
                self.max_stored = max(self.max_stored, st.get("stored") or 0)
                self.max_values = max(self.max_values, st.get("values") or 0)

    def line(self) -> str:
        free = "?" if self.min_free is None else f"{self.min_free / GB:.1f} GB"
        return (f"disk min free {free}, disk tier at most {self.max_stored / GB:.1f} GB stored "
                f"({self.max_values / GB:.1f} GB of values)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=116000)
    parser.add_argument("--panel", type=int, default=1000)
    parser.add_argument("--budget", type=float, default=500.0, help="seconds; no step starts after it")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/user-rechunk-out"))
    parser.add_argument("--cpu", action="store_true", help="a dry run of the steps on CPU workers (small --n)")
    args = parser.parse_args()
    backend = "numpy" if args.cpu else "cupy"
    os.makedirs(args.out, exist_ok=True)
    t_start = time.perf_counter()
    deadline = t_start + args.budget
    n, panel = args.n, args.panel
    results: list[dict] = []

    def record(step, ok, seconds, text, **extra):
        say(step, ok, seconds, text)
        results.append({"step": step, "ok": ok, "seconds": round(seconds, 3), "text": text, **extra})
        with open(os.path.join(args.out, "user-rechunk.json"), "w") as f:
            json.dump({"n": n, "panel": panel, "steps": results}, f, indent=1)

    import concurrent.futures

    import dask
    import numpy as np
    from distributed import futures_of, get_task_stream, wait

    import spillway
    from spillway_bench.reference import array_sum
    from spillway.options.errors import AdmissionError, SpillDiskFull
    from spillway.workflows import random
    from spillway.workflows.backend import to_numpy

    rows, cols = slice(panel - 32, panel + 32), slice(n // 2 - 32, n // 2 + 32)
    window = random.uniform_block(SEED, 0, (n, n), ((rows.start, rows.stop), (cols.start, cols.stop)),
                                  "float64", "numpy")
    pool = concurrent.futures.ThreadPoolExecutor(1)
    reference = pool.submit(array_sum, (n, n), SEED)  # the host's cores, while the GPU works

    def check_x(x, label) -> tuple[bool, str]:
        total, win = dask.compute(x.sum(), x[rows, cols])
        expected = reference.result()
        rel = abs(float(total) - expected) / abs(expected)
        same = np.array_equal(np.asarray(to_numpy(win)), window)
        return rel < 1e-12 and same, f"{label}: sum rel. error {rel:.1e}, window {'exact' if same else 'DIFFERS'}"

    t = time.perf_counter()
    cluster = spillway.local(cpu=True, n_workers=1) if args.cpu else spillway.local()
    say("start", True, time.perf_counter() - t, f"{cluster.n_workers} {cluster.kind} worker(s)")
    client = cluster.client
    watch = DiskWatch(client)
    watch.start()
    try:
        cap = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["spillway-capacity"].capacity())
        if cap is None:
            record("tiers", False, 0.0, "the scheduler has no tiers from the workers: the capacity check is off")
            return 1
        capacity, _ = cap
        directory = next(iter(client.run(disk_state).values()))["directory"]
        say("tiers", None, 0.0, f"device {capacity.device_bytes / GB:.1f} GB + host tier {capacity.host_bytes / GB:.1f} GB"
            f" + disk {capacity.disk_bytes / GB:.1f} GB = {capacity.total_bytes / GB:.1f} GB; spilling to {directory}")

        # 1. X held
        t = time.perf_counter()
        x = client.persist(random.uniform((n, n), (panel, n), seed=SEED, backend=backend))
        wait(futures_of(x))
        record("held", True, time.perf_counter() - t, f"X {n}x{n} float64 persisted: {n * n * 8 / GB:.1f} GB")

        # 2. a persist past every tier beside X
        m = int(((capacity.total_bytes * 1.1) / 8) ** 0.5) // panel * panel + panel
        z = random.uniform((m, m), (panel, m), seed=SEED + 1, backend=backend)
        with get_task_stream(client) as stream:
            t = time.perf_counter()
            zp = z.persist()
            zf = futures_of(zp)
            wait(zf)
            took = time.perf_counter() - t
        error = zf[0].exception() if zf[0].status == "error" else None
        ran = [s for s in stream.data if z.name in str(s["key"])]
        ok = isinstance(error, AdmissionError) and took < 1.0 and not ran
        record("refusal", ok, took, f"Z {m * m * 8 / GB:.1f} GB: {type(error).__name__ if error else 'not refused'}, "
               f"{len(ran)} of its tasks ran: {error}")
        del zp, zf
        t = time.perf_counter()
        ok, text = check_x(x, "X after the refusal")
        record("held-1", ok, time.perf_counter() - t, text)

        # 3. the rechunk beside X
        if time.perf_counter() > deadline:
            record("rechunk", False, 0.0, "not started: out of budget")
        else:
            y = x.rechunk((n, panel))
            with get_task_stream(client) as stream:
                t = time.perf_counter()
                yp = y.persist()
                yf = futures_of(yp)
                wait(yf)
                took = time.perf_counter() - t
            errors = {type(f.exception()).__name__ for f in yf if f.status == "error"}
            first = next((f.exception() for f in yf if f.status == "error"), None)
            ran = sum(1 for s in stream.data if "rechunk" in str(s["key"]))
            if not errors:
                t2 = time.perf_counter()
                total, win = dask.compute(yp.sum(), yp[rows, cols])
                rel = abs(float(total) - reference.result()) / abs(reference.result())
                same = np.array_equal(np.asarray(to_numpy(win)), window)
                record("rechunk", rel < 1e-12 and same, took,
                       f"completed: Y {n}x{n} in column panels beside X ({2 * n * n * 8 / GB:.1f} GB), "
                       f"{ran} rechunk tasks; sum rel. error {rel:.1e}, window {'exact' if same else 'DIFFERS'} "
                       f"(checked in {time.perf_counter() - t2:.1f} s); {watch.line()}", outcome="completed")
            elif errors == {"AdmissionError"}:
                record("rechunk", took < 1.0 and ran == 0, took,
                       f"refused up front, {ran} rechunk tasks ran: {first}", outcome="refused")
            else:
                record("rechunk", isinstance(first, SpillDiskFull), took,
                       f"stopped ({', '.join(sorted(errors))}) after {ran} rechunk tasks: {first}; {watch.line()}",
                       outcome="stopped")
            del yp, yf, y  # y's graph holds X's futures too
        t = time.perf_counter()
        ok, text = check_x(x, "X after the rechunk")
        record("held-2", ok, time.perf_counter() - t, text)

        # 4. the spill disk once the result, then X, are dropped
        time.sleep(3)
        state = next(iter(client.run(disk_state).values()))
        record("disk-1", None, 0.0, f"Y dropped, X held: {state}")
        del x
        deadline_empty = time.monotonic() + 30
        while time.monotonic() < deadline_empty:
            state = next(iter(client.run(disk_state).values()))
            if not state["files"] and not state["keys"]:
                break
            time.sleep(1)
        record("disk", state["files"] == 0 and not state.get("stored") and not state["keys"], 0.0,
               f"everything dropped: {state}")

        # 5. a verified workflow on the same cluster
        t = time.perf_counter()
        report = cluster.run("transpose-sum", size="40000x40000", verify=True, progress=False)
        record("workflow", bool(report["verify"] and report["verify"]["ok"]), time.perf_counter() - t,
               f"transpose-sum 40000x40000 verified: {report['verify']}")
    finally:
        watch.stop.set()
        say("disk", None, 0.0, watch.line())
        t = time.perf_counter()
        print("user-rechunk: closing", file=sys.stderr, flush=True)
        cluster.close()
        print("user-rechunk: closed", file=sys.stderr, flush=True)
        say("close", None, time.perf_counter() - t, "closed")
        pool.shutdown(wait=False, cancel_futures=True)
    judged = [r for r in results if r["ok"] is not None]
    good = sum(1 for r in judged if r["ok"])
    print(f"user-rechunk: {good} of {len(judged)} steps ok ({time.perf_counter() - t_start:.0f} s in all)")
    return 0 if good == len(judged) else 1


if __name__ == "__main__":
    sys.exit(main())
