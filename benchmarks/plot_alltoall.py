"""W3's all-to-all four ways on two GPUs, from committed results (issue 50): spillway's
collective (each timed run of each bench file given), plain dask-cuda's task rechunk (the
same files), NCCL's all-to-all of the same bytes (the floor for moving them) and the copy
bound. One PNG.

  python benchmarks/plot_alltoall.py OUT.png NCCL.json BENCH.json [BENCH.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out, nccl_path, *bench_paths = sys.argv[1:]
    nccl = json.loads(Path(nccl_path).read_text())
    fig, ax = plt.subplots(figsize=(8, 4.2))
    labels, bound = [], None
    for k, path in enumerate(bench_paths):
        data = json.loads(Path(path).read_text())
        (w3,) = [w for w in data["workloads"] if w["name"] == "W3"]
        bound = (w3.get("bound") or {}).get("bound_s", bound)
        ax.scatter([k] * len(w3["spillway"]["runs_s"]), w3["spillway"]["runs_s"], color="tab:blue",
                   label="spillway collective (each run)" if k == 0 else None)
        ax.scatter([k + 0.15] * len(w3["baseline"]["runs_s"]), w3["baseline"]["runs_s"], color="tab:orange",
                   label="plain dask-cuda 26.10, tasks rechunk (each run)" if k == 0 else None)
        labels.append(f"{data.get('label', Path(path).stem)}\n{w3['speedup']:.2f}x")
    ax.axhline(nccl["median_s"], color="tab:green", ls="--",
               label=f"NCCL all_to_all of the same bytes ({nccl['median_s'] * 1e3:.0f} ms)")
    if bound:
        ax.axhline(bound, color="gray", ls=":", label=f"copy bound ({bound * 1e3:.0f} ms)")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("seconds (80000^2 float64, row to column panels)")
    ax.set_yscale("log")
    ax.set_title("W3 on 2 x H200: medians' ratio under each call; dask's P2P rechunk fails on CuPy chunks")
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.02, 0.12))
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
