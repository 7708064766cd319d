"""A notebook user's close and reopen: ``spillway.local()`` at its defaults, a persisted
CuPy field, a slice of it computed to the client (a CuPy value through UCX into this
process), the cluster closed, then each GPU's free memory read until it is back (or
``--wait`` seconds pass), and a second ``spillway.local()`` in the same process.

    python3 benchmarks/gpu-host/reopen.py [--gb 20] [--wait 30] [--rounds 2]

Before the client took no CUDA IPC (launch/ucx_env.py), this process kept each worker's
whole RMM pool mapped after the workers exited (123 GB of each H200), and the second
cluster could not take its pools. Prints a line per step and a JSON line last.
"""

from __future__ import annotations

import argparse
import json
import time


def free_gb() -> list[float]:
    from spillway.options.gpus import discover

    return [round(g.memory_free / 1e9, 1) for g in discover().gpus]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, default=20.0)
    p.add_argument("--wait", type=float, default=30.0)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()

    import spillway
    from distributed import wait

    from spillway.workflows import random

    start = free_gb()
    print(f"reopen: free at start {start} GB", flush=True)
    out: dict = {"start_free_gb": start, "rounds": []}
    n = int((args.gb * 1e9 / 8) ** 0.5)
    for r in range(args.rounds):
        row: dict = {"round": r}
        t0 = time.perf_counter()
        try:
            cluster = spillway.local()
        except Exception as e:  # noqa: BLE001 (the second open refused is the finding)
            row["open_error"] = f"{type(e).__name__}: {e}"
            print(f"reopen: round {r}: open refused after {time.perf_counter() - t0:.1f} s: {row['open_error']}",
                  flush=True)
            out["rounds"].append(row)
            break
        row["open_s"] = time.perf_counter() - t0
        try:
            x = random.uniform((n, n), (n, max(1, n // 8)), seed=r, dtype="float64", backend="cupy").persist()
            wait(x)
            t1 = time.perf_counter()
            value = x[:1000].compute()  # a CuPy value into this process
            row["value"] = f"{type(value).__module__}.{type(value).__name__} {value.nbytes / 1e6:.0f} MB"
            row["compute_s"] = time.perf_counter() - t1
            del value, x
        finally:
            t2 = time.perf_counter()
            cluster.close()
            row["close_s"] = time.perf_counter() - t2
        t3 = time.perf_counter()
        back = None
        while time.perf_counter() - t3 < args.wait:
            now = free_gb()
            if all(f + 2.0 >= s for f, s in zip(now, start)):
                back = time.perf_counter() - t3
                break
            time.sleep(0.5)
        row["free_after_close_gb"] = free_gb()
        row["back_s"] = back
        print(f"reopen: round {r}: open {row['open_s']:.1f} s, {row.get('value')} in {row.get('compute_s', 0):.2f} s, "
              f"close {row['close_s']:.1f} s, GPUs back "
              + (f"{back:.1f} s after" if back is not None else f"NOT within {args.wait:.0f} s")
              + f" (free {row['free_after_close_gb']} GB)", flush=True)
        out["rounds"].append(row)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
