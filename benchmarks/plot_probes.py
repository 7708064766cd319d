"""The ten-run probe's runs (issue 55), one column per probe: the first run (large marker)
and runs 2-10 (dots) on a log scale, plain dask-cuda in grey, each probe labelled with
what its code or options were. Reads the probes' JSON files (``ten_runs.py``'s line).

  python benchmarks/plot_probes.py OUT.png LABEL=FILE.json [LABEL=FILE.json ...]
"""

from __future__ import annotations

import json
import sys


def load(path: str) -> dict:
    with open(path) as f:
        return json.loads([line for line in f if line.startswith("{")][-1])


def main(argv: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out, pairs = argv[0], [a.split("=", 1) for a in argv[1:]]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(pairs)), 4.5))
    for x, (label, path) in enumerate(pairs):
        r = load(path)
        color = "0.55" if r["rig"] == "dask-cuda" else "tab:blue"
        ax.scatter([x], r["runs_s"][:1], s=70, marker="D", color=color, zorder=3)
        ax.scatter([x] * (len(r["runs_s"]) - 1), r["runs_s"][1:], s=14, color=color, alpha=0.8, zorder=3)
    ax.set_yscale("log")
    ax.set_xticks(range(len(pairs)), [label for label, _ in pairs], rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("seconds per run (log)")
    ax.set_title("ten-run probe, fresh cluster each: first run (diamond), runs 2-10 (dots); dask-cuda grey",
                 fontsize=9)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
