"""The figure of one chunk moved between two workers of one GPU: milliseconds per transfer
by size, for each UCXX / distributed setting of the knobs run, and where the time goes in
the anatomy run (raw UCXX, distributed's comm layer, two spillway workers, each with and
without distributed's offload thread).

    python benchmarks/plot_transfers.py benchmarks/results/<machine>-<date>-s4-transfer
        (reads <stem>-knobs.json and <stem>-anatomy.json, writes <stem>s.png)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def main(stem: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    knobs = json.loads(Path(stem + "-knobs.json").read_text())
    anatomy = json.loads(Path(stem + "-anatomy.json").read_text())
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax in (left, right):  # a dozen lines: more colours than matplotlib's default ten
        ax.set_prop_cycle(color=[plt.cm.tab20(i) for i in range(0, 20, 1)][::2] + [plt.cm.tab20(i) for i in range(1, 20, 2)])
    for name, run in knobs.items():
        moves = run["moves"]
        left.plot([m["bytes"] / 2**20 for m in moves], [m["median_s"] * 1e3 for m in moves], marker="o",
                  label=name, linewidth=2.5 if name in ("default", "transfer-offload") else 1.2)
    left.set_xscale("log", base=2)
    left.set_xlabel("chunk (MiB)")
    left.set_ylabel("ms per transfer, median of 5 (lower is better)")
    left.set_title("two spillway workers on one H100: by setting")
    left.legend(fontsize=7)
    sizes = anatomy["sizes"]
    for name, row in anatomy["rows"].items():
        if "multi-buffer" in name:
            continue  # tens to thousands of ms: off the scale of the rest
        by_size = [statistics.median(s["total"] for s in row["steps"] if s["bytes"] == b and not s.get("warm_up"))
                   for b in sizes]
        right.plot([b / 2**20 for b in sizes], by_size, marker="o", label=name,
                   linestyle="-" if "no-offload" in name or name.startswith("raw") else "--")
    right.set_xscale("log", base=2)
    right.set_xlabel("chunk (MiB)")
    right.set_ylabel("ms per transfer, median of 5")
    right.set_title("where a transfer's time goes: raw UCXX, comm layer, workers")
    right.legend(fontsize=7)
    fig.tight_layout()
    out = Path(stem + "s.png")
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1]))
