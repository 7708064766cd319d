"""W3's rechunk and W4's FFT at sizes of the call's choosing, each exchange way on a cluster
of its own (one GPU, two workers on it by default), with the HBM-copy bound measured in
the same run: issue 73's rows at the largest size that spills nothing.

    python3 benchmarks/gpu-host/step_sizes.py --sizes W3:48000,W4:28000 --ways step,pieces,tasks \
        --workers-per-gpu 2 --runs 3 --out $OUT/step-sizes.json

``step``: one step a worker (``exchange: step``); ``pieces``: the pieces' tasks (``exchange:
pieces``); ``tasks``: dask's task method on the step's cluster. Each row: the first run
(after the inputs are persisted) and the median of ``--runs``, the bytes each tier spilled,
the answer compared bit for bit with the task method's on the same cluster, and the bound:
the least HBM traffic (the array read and written once) at the HBM copy rate measured
here, or the bytes between workers at the same-GPU copy rate where that is larger.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def hbm_copy_gbps(backend: str) -> float:
    if backend == "numpy":  # a CPU trial of the script: host memory's copy
        import numpy as cupy

        cupy.cuda = None
    else:
        import cupy

    a = cupy.ones(1 << 28 if backend == "numpy" else 1 << 30, dtype=cupy.uint8)
    b = cupy.empty_like(a)
    b[...] = a
    sync = (lambda: None) if backend == "numpy" else cupy.cuda.Device().synchronize
    sync()
    began = time.perf_counter()
    for _ in range(10):
        b[...] = a
    sync()
    return 2 * 10 * a.nbytes / (time.perf_counter() - began) / 1e9  # read + write


def params(name: str, n: int) -> dict:
    if name == "W3":
        return {"shape": (n, n), "chunks": (1000, n), "dtype": "float64", "to_chunks": (n, 1000)}
    return {"shape": (n, n), "chunks": (5000, 5000), "dtype": "complex128", "to_chunks": (n, 1000)}


def build(name: str, p: dict, way: str, inputs):
    import dask.array as da

    from spillway.datapath.collective import rechunk as exchange

    if way == "tasks":
        y = inputs.rechunk(p["to_chunks"], method="tasks")
    else:
        y = exchange(inputs, p["to_chunks"])
    return da.fft.fft(y, axis=0) if name == "W4" else y


def inputs_of(name: str, p: dict, client, backend: str):
    from spillway_bench.workloads import expressions as ex
    from distributed import wait

    if name == "W3":
        from spillway.workflows import random

        x = random.uniform(p["shape"], p["chunks"], seed=3, dtype=p["dtype"], backend=backend)
    else:
        x = ex.complex_uniform(p["shape"], p["chunks"], seed=3, backend=backend)
    x = client.persist(x)
    wait(x)
    return x


def spilled(client) -> int:
    from spillway.run.measuring import store_moves

    return sum(int(n) for moves in client.run(store_moves).values() if moves
               for move, n in moves["bytes"].items() if str(move).startswith("device"))


def _first_key(y):
    key = y.__dask_keys__()
    while isinstance(key, list):
        key = key[0]
    return key


def _released(client, key, most_s: float = 5.0) -> None:
    """Waits until the scheduler forgot ``key`` of the run before: a key still held makes
    the next run of the same graph take it as done, and its bytes count as held when the
    next rechunk asks the cluster's room (:func:`spillway.datapath.collective.way.way`)."""
    deadline = time.monotonic() + most_s
    while time.monotonic() < deadline:
        if not client.run_on_scheduler(lambda dask_scheduler, k=key: k in dask_scheduler.tasks):
            return
        time.sleep(0.02)


def _phases(before: dict, after: dict) -> str:
    """ms each worker's steps spent in each phase between two readings of
    :func:`spillway.run.measuring.step_phases`."""
    out = []
    for worker, now in sorted(after.items()):
        if not now:
            continue
        was = (before.get(worker) or {}).get("seconds", {})
        spent = {k: 1e3 * (v - was.get(k, 0.0)) for k, v in now["seconds"].items()}
        out.append(" ".join(f"{k.removeprefix('step_')} {v:.1f}" for k, v in spent.items() if v > 0.005))
    return " | ".join(out)


def _timeline(tasks: list, began: float) -> str:
    """ms from the run's start: when each group of tasks (by its key's name's prefix) began
    and ended, and how many there were."""
    groups: dict = {}
    for t in tasks:
        key = t["key"]
        name = key[0] if isinstance(key, tuple) else key
        group = str(name).rsplit("-", 1)[0]
        for s in t.get("startstops", ()):
            if s.get("action") not in ("compute", "transfer"):
                continue
            label = group if s["action"] == "compute" else f"{group} (transfers)"
            found = groups.setdefault(label, [s["start"], s["stop"], 0])
            found[0], found[1], found[2] = min(found[0], s["start"]), max(found[1], s["stop"]), found[2] + 1
    return ", ".join(f"{g} x{n} {1e3 * (a - began):.1f}-{1e3 * (b - began):.1f} ms"
                     for g, (a, b, n) in sorted(groups.items(), key=lambda kv: kv[1][0]))


def run_way(way: str, sizes: list, runs: int, workers_per_gpu: int, backend: str, log,
            transport: str = "auto") -> list:
    from distributed import get_task_stream, wait

    from spillway.run.measuring import step_phases

    from spillway.launch import open_cluster
    from spillway.options.settings import Options

    where = {"cpu": True, "n_workers": 2} if backend == "numpy" else {"devices": "0",
                                                                       "workers_per_gpu": workers_per_gpu}
    options = Options.resolve(dashboard_address=None, exchange="pieces" if way == "pieces" else "step",
                              exchange_transport=transport, **where)
    rows = []
    began = time.perf_counter()
    with open_cluster(options) as session:
        client = session.client
        log(f"{way}: cluster of {session.n_workers} workers up in {time.perf_counter() - began:.1f} s")
        for name, n in sizes:
            p = params(name, n)
            x = inputs_of(name, p, client, backend)
            before = spilled(client)
            times = []
            method = None
            for k in range(runs + 1):
                y = build(name, p, way, x)
                method = next((m for prefix, m in (("spillway-step-", "step"), ("spillway-cut-", "pieces"),
                                                   ("rechunk-", "tasks")) if any(str(l).startswith(prefix)
                                                                                 for l in y.dask.layers)), "?")
                t0 = time.perf_counter()
                if k == runs:  # the last run's timeline: where the time goes
                    before_phases = client.run(step_phases)
                    t0 = time.perf_counter()
                    with get_task_stream(client) as stream:
                        y = client.persist(y)
                        wait(y)
                    times.append(time.perf_counter() - t0)
                    timeline = _timeline(stream.data, time.time() - times[-1])
                    log(f"{way} {name} n={n} last run: {timeline}")
                    phases = _phases(before_phases, client.run(step_phases))
                    if phases:
                        log(f"{way} {name} n={n} last run's steps: {phases}")
                else:
                    y = client.persist(y)
                    wait(y)
                    times.append(time.perf_counter() - t0)
                if k < runs:
                    # forgotten before the next build, which asks the room for its way
                    key = _first_key(y)
                    del y
                    _released(client, key)
            moved_out = spilled(client) - before  # before the check, which holds two answers
            ref = build(name, p, "tasks", x)
            exact = bool(client.compute((y == ref).all()).result())
            del y, ref
            row = {"workload": name, "n": n, "way": way, "method": method, "first_s": times[0],
                   "median_s": statistics.median(times[1:]), "runs_s": times,
                   "array_bytes": int(x.nbytes), "spilled_bytes": moved_out, "exact": exact}
            log(f"{way} {name} n={n}: first {times[0]:.3f} s, median {row['median_s']:.3f} s, "
                f"spilled {row['spilled_bytes'] / 1e9:.2f} GB, exact {exact} ({method})")
            rows.append(row)
            del x
    return rows


def plot(rows: list, path: str, title: str) -> None:
    """Each row's median beside its bound, a group a (workload, size), a bar a way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if not r.get("artifact")]
    cases = list(dict.fromkeys((r["workload"], r["n"]) for r in rows))
    ways = list(dict.fromkeys(r["way"] for r in rows))
    width = 0.8 / (len(ways) + 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(cases)), 4))
    for k, way in enumerate(ways + ["bound"]):
        heights = []
        for case in cases:
            found = [r for r in rows if (r["workload"], r["n"]) == case and (way == "bound" or r["way"] == way)]
            heights.append((found[0]["bound_s"] if way == "bound" else found[0]["median_s"]) if found else 0)
        ax.bar([c + k * width for c in range(len(cases))], heights, width, label=way,
               color="0.6" if way == "bound" else None)
    ax.set_xticks([c + width * len(ways) / 2 for c in range(len(cases))])
    ax.set_xticklabels([f"{w} {n}^2" for w, n in cases])
    ax.set_yscale("log")
    ax.set_ylabel("median s (log)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="W3:40000,W4:20000")
    parser.add_argument("--ways", default="step,pieces,tasks")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers-per-gpu", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--backend", default="cupy", choices=("cupy", "numpy"))
    parser.add_argument("--transport", default="auto", help="the steps' exchange-transport (auto, ipc, ucxx, host)")
    parser.add_argument("--plot", default=None, help="only plot this results file (a PNG beside it)")
    args = parser.parse_args()
    if args.plot:
        with open(args.plot) as f:
            found = json.load(f)
        for r in found["rows"]:
            r.setdefault("bound_s", 2 * r["array_bytes"] / (found["hbm_copy_gbps"] * 1e9))
        plot(found["rows"], args.plot.removesuffix(".json") + ".png", "W3, W4 on two workers of one H100: median and bound")
        return 0
    sizes = [(s.split(":")[0], int(s.split(":")[1])) for s in args.sizes.split(",")]

    def log(line):
        print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)

    hbm = hbm_copy_gbps(args.backend)
    log(f"HBM copy {hbm:.0f} GB/s (read + write)")
    rows = []
    for way in args.ways.split(","):
        rows += run_way(way, sizes, args.runs, args.workers_per_gpu, args.backend, log, args.transport)
    print(f"\n{'row':<22} {'first s':>8} {'median s':>9} {'bound s':>8} {'x bound':>8} {'spilled GB':>10} exact")
    for r in rows:
        bound = 2 * r["array_bytes"] / (hbm * 1e9)
        r["bound_s"] = bound
        print(f"{r['way'] + ' ' + r['workload'] + ' ' + str(r['n']):<22} {r['first_s']:>8.3f} {r['median_s']:>9.3f} "
              f"{bound:>8.4f} {r['median_s'] / bound:>7.1f}x {r['spilled_bytes'] / 1e9:>10.2f} {r['exact']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"hbm_copy_gbps": hbm, "rows": rows}, f, indent=1)
        plot(rows, args.out.removesuffix(".json") + ".png", "W3, W4 on two workers of one GPU: median and bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
