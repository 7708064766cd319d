"""What W3's all-to-all costs by other ways than spillway's collective, on two GPUs
(issue 50, item 5). One JSON line a way:

  nccl   NCCL's all-to-all (PyTorch's ``all_to_all_single``, one process a GPU): the bytes
         of W3 (80000^2 float64, each GPU holding half) exchanged as one collective, no
         cutting or joining: the floor for moving them
  p2p    dask's P2P rechunk of W3 on plain dask-cuda (``method="p2p"``, CuPy row panels to
         column panels, ``.sum()``), the way dask offers for a bulk rechunk

  python alltoall_compare.py nccl [--gb 51.2] [--runs 5]     (the host's PyTorch python)
  python alltoall_compare.py p2p [--size 80000] [--runs 3]   (with dask-cuda and ucxx)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def _nccl_rank(rank: int, world: int, nbytes: int, runs: int, port: int, queue) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    n = nbytes // 8 // world * world
    send = torch.arange(n, dtype=torch.float64, device="cuda") + rank * 1e12
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)  # warm-up: NCCL's channels and buffers
    torch.cuda.synchronize()
    part = n // world
    # a sample of each part (the whole would need another buffer of its size)
    step = max(1, part // 1_000_000)
    same = all(bool(torch.equal(recv[j * part: (j + 1) * part: step],
                                torch.arange(rank * part, (rank + 1) * part, step, dtype=torch.float64,
                                             device="cuda") + j * 1e12)) for j in range(world))
    times = []
    for _ in range(runs):
        dist.barrier()
        torch.cuda.synchronize()
        began = time.perf_counter()
        dist.all_to_all_single(recv, send)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    queue.put({"rank": rank, "times": times, "same": same})
    dist.destroy_process_group()


def nccl(args) -> dict:
    import torch.multiprocessing as mp

    world = 2
    nbytes = int(args.gb * 1e9 / world)  # what each GPU holds
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_nccl_rank, args=(r, world, nbytes, args.runs, 29500 + os.getpid() % 400, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    found = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
    times = [max(t) for t in zip(*(f["times"] for f in found))]  # a run ends when both ranks end
    crossing = nbytes * (world - 1) / world  # what each GPU sends to the other
    median = statistics.median(times)
    return {"way": "nccl all_to_all_single", "gpus": world, "bytes_per_gpu": nbytes, "runs_s": times,
            "median_s": median, "crossing_gbps_per_direction": crossing / median / 1e9,
            "same_bits": all(f["same"] for f in found)}


def p2p(args) -> dict:
    import cupy
    import dask
    import dask.array as da
    from dask_cuda import LocalCUDACluster
    from distributed import Client, wait

    n = args.size
    out: dict = {"way": "dask P2P rechunk on plain dask-cuda", "shape": [n, n], "chunks_in": [1000, n],
                 "chunks_out": [n, 1000], "runs_s": []}
    with LocalCUDACluster(protocol="ucx", CUDA_VISIBLE_DEVICES="0,1") as cluster, Client(cluster) as client:
        x = da.random.default_rng(1).random((n, n), chunks=(1000, n)).map_blocks(cupy.asarray)
        x = x.persist()
        wait(x)
        want = float(x.sum().compute())
        for run in range(args.runs + 1):
            began = time.perf_counter()
            try:
                with dask.config.set({"array.rechunk.method": "p2p"}):
                    got = float(x.rechunk((n, 1000), method="p2p").sum().compute())
            except Exception as e:  # noqa: BLE001 (what fails is the finding)
                out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                break
            elapsed = time.perf_counter() - began
            if run:
                out["runs_s"].append(elapsed)
            else:
                out["warm_up_s"] = elapsed
            out["same_sum"] = abs(got - want) <= 1e-9 * abs(want)
        _ = client
    if out["runs_s"]:
        out["median_s"] = statistics.median(out["runs_s"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="way", required=True)
    a = sub.add_parser("nccl")
    a.add_argument("--gb", type=float, default=51.2)
    a.add_argument("--runs", type=int, default=5)
    b = sub.add_parser("p2p")
    b.add_argument("--size", type=int, default=80000)
    b.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(nccl(args) if args.way == "nccl" else p2p(args)), flush=True)


if __name__ == "__main__":
    main()
