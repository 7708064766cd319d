"""A plot of ten-run probes (ten_runs.py, probes.sh): for each fresh cluster in the order it
ran, its start split into the steps spillway times (dask-cuda's start whole), and its first
run beside the median and longest of runs 2-10.

  python benchmarks/gpu-host/plot_probes.py OUT.png DIR [TITLE]   (DIR holds probe-N-NAME.json)
"""

from __future__ import annotations

import glob
import json
import os
import sys


def load(directory: str) -> list[tuple[str, dict]]:
    found = []
    for path in glob.glob(os.path.join(directory, "probe-*.json")):
        name = os.path.basename(path)[len("probe-"):-len(".json")]
        lines = [line for line in open(path) if line.startswith("{")]
        if lines:
            found.append((name, json.loads(lines[-1])))
    return sorted(found, key=lambda item: int(item[0].split("-")[0]))


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out, directory = sys.argv[1], sys.argv[2]
    title = sys.argv[3] if len(sys.argv) > 3 else "ten-run probe, fresh clusters in order"
    probes = load(directory)
    names = [n for n, _ in probes]
    fig, (start, runs) = plt.subplots(1, 2, figsize=(14, 5.5))
    steps = []
    for _, r in probes:
        for k in r.get("start_steps") or {}:
            if k not in steps:
                steps.append(k)
    bottom = [0.0] * len(probes)
    for step in steps:
        values = [(r.get("start_steps") or {}).get(step, 0.0) for _, r in probes]
        start.bar(names, values, bottom=bottom, label=step)
        bottom = [b + v for b, v in zip(bottom, values)]
    whole = [r["start_s"] if not r.get("start_steps") else 0.0 for _, r in probes]
    start.bar(names, whole, bottom=bottom, label="start (not split)", color="0.6")
    base = [r["start_s"] for n, r in probes if "dask-cuda" in n]
    if base:
        start.axhline(2 * min(base), color="k", ls="--", lw=1, label="2x dask-cuda's start")
    start.set_ylabel("seconds")
    start.set_title("cluster start")
    start.legend(fontsize=7)
    start.tick_params(axis="x", rotation=60, labelsize=8)
    x = range(len(probes))
    runs.bar([i - 0.27 for i in x], [r["first_s"] for _, r in probes], width=0.27, label="first run")
    runs.bar(list(x), [r["later_median_s"] for _, r in probes], width=0.27, label="runs 2-10 median")
    runs.bar([i + 0.27 for i in x], [r["later_max_s"] for _, r in probes], width=0.27, label="runs 2-10 longest")
    runs.set_yscale("log")
    runs.set_xticks(list(x), names, rotation=60, fontsize=8)
    runs.set_ylabel("seconds (log)")
    runs.set_title("(x + x.T).sum() of a persisted 40000^2 float64")
    runs.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


if __name__ == "__main__":
    main()
