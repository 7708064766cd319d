"""One chunk moved between two workers, timed from the receiver's ``transfer_incoming_log``
(from the request for the data to the data in its memory), its bits compared with the sent.

``python -m spillway_bench.transfers --rig spillway|dask-cuda --sizes 16MiB,1GiB
[--device 0|0,1] [--ceiling]``: two workers on GPU 0 (spillway with ``workers-per-gpu 2``)
or one on each of two GPUs, or plain dask-cuda's processes; one JSON object.
:func:`moves` is the measurement for any client with two workers (the GPU tests use it).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time

#: transfers timed at each size after one warm-up (the endpoint's first use, the IPC
#: handle of the sender's pool opened)
REPEATS = 5
SIZES = "16MiB,256MiB,1GiB,4GiB"


def _make(nbytes: int, seed: int, module: str = "cupy"):
    xp = importlib.import_module(module)
    return xp.random.default_rng(seed).random(nbytes // 8)


def _same_bits(array, nbytes: int, seed: int, module: str = "cupy") -> bool:
    """Whether ``array`` (received) holds the bits of ``_make(nbytes, seed)``, made again
    here: the same generator gives the same bits on the same GPU."""
    xp = importlib.import_module(module)
    sent = _make(nbytes, seed, module)
    return bool((array.view(xp.uint64) == sent.view(xp.uint64)).all())


def _incoming(dask_worker) -> list[dict]:
    return [incoming_entry(e) for e in dask_worker.transfer_incoming_log]


def incoming_entry(entry: dict) -> dict:
    """One entry of a worker's incoming transfer log, timed by its own ``stop - start``:
    the log's ``duration`` is floored at 1 ms (distributed's ``max(0.001, stop - start)``,
    kept for its bandwidth estimate), so a transfer under 1 ms read from it reads 1 ms."""
    return {"keys": [str(k) for k in entry["keys"]], "seconds": entry["stop"] - entry["start"],
            "total": entry["total"], "who": entry["who"]}


def two_workers(client) -> tuple[str, str]:
    from spillway.launch import scheduler_workers

    workers = sorted(scheduler_workers(client))
    if len(workers) < 2:
        raise RuntimeError(f"moving a chunk needs two workers, the cluster has {len(workers)}")
    return workers[0], workers[1]


def move(client, nbytes: int, seed: int, src: str, dst: str, module: str = "cupy") -> dict:
    """Make an array of ``nbytes`` on ``src``, have ``dst`` check it: ``{"seconds",
    "bytes", "same_bits"}`` from ``dst``'s incoming transfer log. ``module``: the array
    library of the chunks (NumPy for CPU workers)."""
    from distributed import wait

    made = client.submit(_make, nbytes, seed, module, workers=[src], allow_other_workers=False, pure=False)
    wait(made)  # made before the receiver asks for it: its log then times the transfer alone
    checked = client.submit(_same_bits, made, nbytes, seed, module, workers=[dst], allow_other_workers=False,
                            pure=False)
    same = checked.result()
    key = str(made.key)
    entries = [e for e in client.run(_incoming, workers=[dst])[dst] if key in e["keys"]]
    del made, checked
    if not entries:
        raise RuntimeError(f"no incoming transfer of {key} on {dst}: the chunk did not move between workers")
    entry = entries[-1]
    return {"seconds": entry["seconds"], "bytes": entry["total"], "same_bits": same}


def moves(client, sizes, *, repeats: int = REPEATS, seed: int = 1000, module: str = "cupy") -> list[dict]:
    """For each of ``sizes`` (bytes): a warm-up move and ``repeats`` timed ones from the
    first worker to the second; the median and fastest time, the rate at the median, and
    whether every move kept the bits."""
    src, dst = two_workers(client)
    out = []
    for nbytes in sizes:
        move(client, nbytes, seed, src, dst, module)
        seed += 1
        timed = []
        for _ in range(repeats):
            timed.append(move(client, nbytes, seed, src, dst, module))
            seed += 1
        seconds = [m["seconds"] for m in timed]
        median = statistics.median(seconds)
        out.append({"bytes": nbytes, "median_s": median, "min_s": min(seconds),
                    "gbps_median": nbytes / median / 1e9 if median > 0 else None,
                    "same_bits": all(m["same_bits"] for m in timed), "repeats": repeats})
    return out


def _parse_sizes(text: str) -> list[int]:
    from spillway.options.sizes import parse_size

    return [parse_size(item.strip(), name="sizes", minimum=8) for item in text.split(",") if item.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spillway_bench.transfers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rig", choices=("spillway", "dask-cuda"), required=True)
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--device", default="0",
                        help="the GPU both workers share (0), or the two GPUs of one worker each (0,1)")
    parser.add_argument("--ceiling", action="store_true", help="measure the copy ceilings first")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a spillway option of the spillway rig (repeatable)")
    args = parser.parse_args(argv)
    sizes = _parse_sizes(args.sizes)
    devices = tuple(d.strip() for d in args.device.split(",") if d.strip())
    if len(devices) == 1:
        devices = devices * 2
    if len(devices) != 2:
        parser.error(f"--device: one GPU or two, not {args.device!r}")
    result = {"rig": args.rig, "sizes": sizes, "options": args.option,
              # the UCXX settings the workers inherit from this process's environment
              "env": {k: v for k, v in os.environ.items() if k.startswith(("UCXPY_", "DASK_DISTRIBUTED_UCXX__"))}}
    if args.ceiling:
        from .ceilings import gpu_ceilings

        # before any cluster holds the GPU's memory; two workers of one GPU: a copy
        # within it, and UCXX alone between two processes on it
        result["ceilings"] = {}
        for nbytes in sizes:
            gbps, skipped = gpu_ceilings(devices, nbytes)
            result["ceilings"][str(nbytes)] = {"gbps": gbps, "skipped": skipped}
    started = time.perf_counter()
    if args.rig == "spillway":
        from spillway.launch import open_cluster
        from spillway.options.settings import Options
        from spillway.datapath.transfer import transport
        from spillway.run.measuring import plane_counters

        keywords = dict(item.split("=", 1) for item in args.option)
        same_gpu = devices[0] == devices[1]
        options = Options.resolve(devices=devices[0] if same_gpu else ",".join(devices),
                                  workers_per_gpu=2 if same_gpu else 1, dashboard_address=None,
                                  **{k.replace("-", "_"): v for k, v in keywords.items()})
        with open_cluster(options) as session:
            result["start_s"] = time.perf_counter() - started
            result["transport"] = transport(session.client)
            result["moves"] = moves(session.client, sizes, repeats=args.repeats)
            result["data_plane"] = session.client.run(plane_counters)
    else:
        from spillway.datapath.transfer import transport

        from .clusters import dask_cuda_processes

        with dask_cuda_processes(devices) as (client, described):
            result["start_s"] = time.perf_counter() - started
            result["cluster"] = described["cluster"]
            result["transport"] = transport(client)
            result["moves"] = moves(client, sizes, repeats=args.repeats)
    print(json.dumps(result))
    return 0 if all(m["same_bits"] for m in result["moves"]) else 1


if __name__ == "__main__":
    sys.exit(main())

