"""Where the time of a large panel rechunk goes (issue 50): the rechunk workflow's exchange
(row panels of ``--chunks`` rows to column panels, inputs generated on the devices in the
graph, outputs kept) on ``spillway.local()`` with its defaults, run ``--runs`` times on one
cluster, each followed by the collective's phases on each worker, the data plane's
counters and the tiered store's spill. One JSON line a run.

  python benchmarks/gpu-host/rechunk_phases.py [--size 158113] [--chunks 1000] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    import cupy
    import dask.array as da
    from distributed import wait

    import spillway
    from spillway.cluster.collective import rechunk
    from spillway.cluster.collective.exchange import phases
    from spillway.cluster.dataplane import counters

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=158113)
    parser.add_argument("--chunks", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--devices", default="0,1")
    args = parser.parse_args()
    n, c = args.size, args.chunks
    with spillway.local(devices=args.devices, dashboard_address="") as lc:
        client = lc.client
        for run in range(args.runs):
            before = client.run(phases)
            state = da.random.RandomState(run, RandomState=cupy.random.RandomState)
            x = state.random_sample((n, n), chunks=(c, n))
            began = time.perf_counter()
            y = rechunk(x, (n, c)).persist()
            wait(y)
            wall = time.perf_counter() - began
            after = client.run(phases)
            summed = {}
            for worker, p in after.items():
                if not p:
                    continue
                b = before.get(worker) or {"seconds": {}, "counts": {}}
                summed[worker] = {k: [round((v - b["seconds"].get(k, 0)) * 1e3, 1),
                                      p["counts"][k] - b["counts"].get(k, 0),
                                      round(p.get("median", {}).get(k, 0) * 1e3, 3)] for k, v in p["seconds"].items()}
            planes = {w: {k: v for k, v in (p or {}).items() if k in ("fetched", "fetched_bytes", "fetch_s", "busy",
                                                                      "fallbacks", "lost")}
                      for w, p in client.run(counters).items()}
            print(json.dumps({"run": run, "bytes": n * n * 8, "wall_s": wall, "phases_ms_count_median": summed,
                              "planes": planes}), flush=True)
            del y, x


if __name__ == "__main__":
    main()
