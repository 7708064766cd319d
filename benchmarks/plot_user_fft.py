"""The user-FFT tables of ``benchmarks/gpu-host/user-fft.sh`` as one figure: each variant's
fresh run and its run after the cluster sat idle, one group a table (a call).

    python benchmarks/plot_user_fft.py OUT.png TABLE.md [TABLE.md ...]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def rows(path: Path) -> list[tuple[str, float | None, float | None]]:
    """(variant, fresh s, idle s) of each row of a user-fft table."""
    out = []
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 5 or cells[0] in ("variant", "---"):
            continue
        seconds = [float(m.group(1)) if (m := re.match(r"([0-9.]+) s$", c)) else None for c in cells[3:5]]
        out.append((cells[0], *seconds))
    return out


def main(argv: list[str]) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target, tables = argv[0], [Path(p) for p in argv[1:]]
    fig, axes = plt.subplots(1, len(tables), figsize=(4.5 * len(tables), 4), squeeze=False)
    for ax, table in zip(axes[0], tables):
        found = rows(table)
        names = [r[0].split(" (")[0] for r in found]
        xs = range(len(found))
        fresh = [r[1] or 0 for r in found]
        idle = [r[2] or 0 for r in found]
        ax.bar([x - 0.2 for x in xs], fresh, 0.4, label="fresh cluster, first run")
        ax.bar([x + 0.2 for x in xs], idle, 0.4, label="after the cluster sat idle (IDLE s: 60 in s13, 45 in s16)")
        for x, v in zip(xs, fresh):
            ax.text(x - 0.2, v, f"{v:.1f}" if v else "failed", ha="center", va="bottom", fontsize=8)
        for x, v in zip(xs, idle):
            if v:
                ax.text(x + 0.2, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs), names, rotation=20, fontsize=8)
        ax.set_ylabel("seconds")
        ax.set_title(table.stem.replace("-s13-user-fft", ""), fontsize=8)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("A user's FFT-rechunk-FFT (and plain rechunk) past the GPUs' memory")
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
