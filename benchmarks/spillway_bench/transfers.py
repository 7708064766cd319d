"""One chunk moved between two workers, timed from the receiving worker's own log.

``python -m spillway_bench.transfers --rig spillway|dask-cuda --sizes 16MiB,1GiB`` starts
two workers, both on GPU 0 (``--device 0``: spillway's cluster with ``workers-per-gpu 2``)
or one on each of two GPUs (``--device 0,1``: one worker per GPU, chunks over NVLink), or
plain dask-cuda's (a scheduler and two ``dask cuda worker`` processes), makes a CuPy array of each size on one
worker, has the other compute on it, and reads the time of that transfer from the
receiver's ``transfer_incoming_log`` (distributed's own record: from the request for the
data to the data in the worker's memory). Each received array is compared bit for bit
with the one sent (both are made from one seed). It prints one JSON object; the device
copy ceiling is measured before any cluster starts (:func:`spillway_bench.ceilings`).

:func:`moves` is the measurement, for any client with two workers (the GPU tests use it).
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
    parser.add_argument("--worker-flag", action="append", default=[], metavar="FLAG",
                        help="a `dask cuda worker` flag of the dask-cuda rig, such as --rmm-pool-size=0.45")
    args = parser.parse_args(argv)
    sizes = _parse_sizes(args.sizes)
    devices = tuple(d.strip() for d in args.device.split(",") if d.strip())
    if len(devices) == 1:
        devices = devices * 2
    if len(devices) != 2:
        parser.error(f"--device: one GPU or two, not {args.device!r}")
    result = {"rig": args.rig, "sizes": sizes, "options": args.option, "worker_flags": args.worker_flag,
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

        with dask_cuda_processes(devices, extra_flags=tuple(args.worker_flag)) as (client, described):
            result["start_s"] = time.perf_counter() - started
            result["cluster"] = described["cluster"]
            result["transport"] = transport(client)
            result["moves"] = moves(client, sizes, repeats=args.repeats)
    print(json.dumps(result))
    return 0 if all(m["same_bits"] for m in result["moves"]) else 1


if __name__ == "__main__":
    sys.exit(main())


def load(path) -> dict:
    """One result of :func:`main` from its file (UCX may have warned on stdout before it)."""
    text = open(path).read()
    return json.loads(text[text.index('{"rig"'):].splitlines()[0])


def summarize(labelled: dict[str, dict], prefix: str) -> str:
    """A markdown table and a figure (``prefix.md``, ``prefix.png``) of moves by rig and
    size, each against the peer copy measured in its own run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = ["| run | size | median ms | min ms | GB/s | of peer copy | same bits |",
            "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ceilings = {}
    for label, result in labelled.items():
        ceilings = result.get("ceilings") or ceilings
        xs, ys = [], []
        for m in result["moves"]:
            peer = ((ceilings.get(str(m["bytes"])) or {}).get("gbps") or {}).get("peer_copy")
            share = f"{m['gbps_median'] / peer:.0%}" if peer else "—"
            rows.append(f"| {label} | {m['bytes'] / 2**20:.0f} MiB | {m['median_s'] * 1e3:.3f} | "
                        f"{m['min_s'] * 1e3:.3f} | {m['gbps_median']:.1f} | {share} | {m['same_bits']} |")
            xs.append(m["bytes"] / 2**20)
            ys.append(m["gbps_median"])
        ax.plot(xs, ys, marker="o", label=label)
    peak = [((ceilings.get(k) or {}).get("gbps") or {}).get("peer_copy") for k in sorted(ceilings, key=int)]
    if any(peak):
        ax.plot([int(k) / 2**20 for k in sorted(ceilings, key=int)], peak, "k--", label="peer copy (ceiling)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("chunk size (MiB)")
    ax.set_ylabel("GB/s, median of the moves")
    ax.set_title("one CuPy chunk moved GPU0 -> GPU1 between two workers")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{prefix}.png", dpi=110)
    plt.close(fig)
    text = "\n".join(rows) + "\n"
    with open(f"{prefix}.md", "w") as f:
        f.write(text)
    return text
