"""The ten-run probe of a fresh cluster (issue 55): a user's own code on a persisted array,
``(x + x.T).sum().compute()`` ten times, a 40000^2 float64 array in 10000^2 chunks made on
the GPUs and persisted first. Prints one JSON line: the cluster's start, the first run,
runs 2-10 (median, longest) and the result against NumPy's sum of the same blocks.

  python benchmarks/gpu-host/ten_runs.py --rig spillway [--devices 0,1] [--workers-per-gpu 2]
  python benchmarks/gpu-host/ten_runs.py --rig dask-cuda [--devices 0,1]

Run each rig in a process of its own, one after the other: each cluster is fresh.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    import cupy
    import dask.array as da
    from distributed import Client, wait

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rig", choices=("spillway", "dask-cuda"), required=True)
    parser.add_argument("--devices", default="0,1")
    parser.add_argument("--workers-per-gpu", type=int, default=1)
    parser.add_argument("--size", type=int, default=40000)
    parser.add_argument("--chunk", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a spillway option for spillway.local (repeatable; values parse as YAML)")
    args = parser.parse_args()
    began = time.perf_counter()
    if args.rig == "spillway":
        import spillway

        import yaml

        chosen = {k.replace("-", "_"): yaml.safe_load(v) for k, v in (o.split("=", 1) for o in args.option)}
        chosen.setdefault("workers_per_gpu", args.workers_per_gpu)
        args.workers_per_gpu = chosen["workers_per_gpu"]
        cluster = spillway.local(devices=args.devices, dashboard_address="", **chosen)
        client = cluster.client
    else:
        from dask_cuda import LocalCUDACluster

        cluster = LocalCUDACluster(protocol="ucx", CUDA_VISIBLE_DEVICES=args.devices, dashboard_address=None)
        client = Client(cluster)
    client.wait_for_workers(len(client.scheduler_info()["workers"]) or 1)
    started = time.perf_counter() - began
    n, c = args.size, args.chunk
    x = da.random.RandomState(1, RandomState=cupy.random.RandomState).random_sample((n, n), chunks=(c, c))
    x = x.persist()
    wait(x)
    from spillway_bench import timeline

    client.get_task_stream(start=0, stop=0)  # installs the scheduler's task-stream plugin
    runs, windows, anatomy = [], [], []
    for _ in range(args.runs):
        t, began = time.perf_counter(), time.time()
        got = float((x + x.T).sum().compute())
        runs.append(time.perf_counter() - t)
        windows.append((began, time.time()))
        anatomy.append(_anatomy(timeline.Recording(client).result(windows[-1])))
    # where the workers grow a pinned arena: the seconds of each run its pins took (a pin
    # holds the driver's locks against every CUDA call on the node)
    pins = None
    if args.rig == "spillway":
        from spillway_bench.measure import arena_pin_overlap
        from spillway.launch.plugins import worker_snapshot

        snapshots = client.run(worker_snapshot)
        pins = [arena_pin_overlap(snapshots, w) for w in windows]
    want = 2 * float(x.sum().compute())  # after: the first run is the cluster's first exchange
    later = runs[1:]
    print(json.dumps({"rig": args.rig, "options": args.option, "devices": args.devices, "workers_per_gpu": args.workers_per_gpu,
                      "workers": len(client.scheduler_info()["workers"]), "start_s": started, "first_s": runs[0],
                      "later_median_s": statistics.median(later), "later_max_s": max(later),
                      "later_over_median": max(later) / statistics.median(later), "runs_s": runs,
                      "arena_pin_s": pins, "anatomy": anatomy,
                      "start_steps": getattr(getattr(cluster, "session", None), "start_steps", None),
                      "rel_error": abs(got - want) / abs(want)}), flush=True)
    client.close()
    cluster.close()


def _anatomy(run: dict) -> dict:
    """Where one run's wall time went (the bench's timeline of it, :mod:`spillway_bench.timeline`):
    the first task's start and the tail after the last task, and per worker its compute,
    transfer and idle seconds, rounded to the millisecond."""
    r = lambda v: None if v is None else round(v, 3)  # noqa: E731
    return {"first_task_s": r(run["first_task_s"]), "tail_s": r(run["tail_s"]),
            "workers": {run["names"][w]: {k: r(v) if isinstance(v, float) else v for k, v in entry.items()}
                        for w, entry in run["workers"].items()}}


if __name__ == "__main__":
    main()
