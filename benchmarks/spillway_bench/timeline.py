"""Where a timed run's time goes on each worker (``--timeline``): from the scheduler's task
stream and the workers' incoming-transfer logs, cut to the run's clock, the wall time per
worker splits into ``compute_s``, ``transfer_s`` (arriving while no task runs),
``other_s`` and ``idle_s``; ``first_task_s`` and ``tail_s`` before the first task and after
the last. One PNG per results file: a panel per workload and side, a row per worker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .formatting import fmt_value
from .sides import NAMES as SIDES

#: classes of activity, highest first: an instant counts for the first one active
CLASSES = ("compute", "transfer", "other")
COLORS = {"compute": "tab:blue", "transfer": "tab:orange", "other": "tab:gray"}
#: intervals kept in the JSON per worker and class are merged across gaps shorter than
#: the run's wall time over this (finer than the plot shows); the summary uses them all
RESOLUTION = 4000


# --- intervals (pure functions)


def union(intervals) -> list[tuple[float, float]]:
    """``intervals`` merged where they overlap or touch, sorted."""
    out: list[list[float]] = []
    for start, stop in sorted((float(a), float(b)) for a, b in intervals if b > a):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], stop)
        else:
            out.append([start, stop])
    return [(a, b) for a, b in out]


def length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def subtract(intervals, minus) -> list[tuple[float, float]]:
    """The parts of sorted disjoint ``intervals`` outside sorted disjoint ``minus``."""
    out = []
    minus = list(minus)
    j = 0
    for a, b in intervals:
        while j < len(minus) and minus[j][1] <= a:
            j += 1
        k, start = j, a
        while k < len(minus) and minus[k][0] < b:
            if minus[k][0] > start:
                out.append((start, minus[k][0]))
            start = max(start, minus[k][1])
            k += 1
        if start < b:
            out.append((start, b))
    return out


def clip(intervals, lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def coarsen(intervals, gap: float) -> list[list[float]]:
    """Sorted disjoint ``intervals`` with gaps shorter than ``gap`` closed, rounded for JSON."""
    out: list[list[float]] = []
    for a, b in intervals:
        if out and a - out[-1][1] < gap:
            out[-1][1] = b
        else:
            out.append([a, b])
    return [[round(a, 4), round(b, 4)] for a, b in out]


def summarize(window: tuple[float, float], activity: dict[str, dict[str, list]],
              counts: dict[str, dict[str, int]] | None = None) -> dict:
    """Per worker, the run's wall time split by :data:`CLASSES` and idle.

    ``activity`` maps a worker to raw intervals per class (absolute seconds); ``counts``
    adds per-worker numbers (tasks, transfers, bytes in) to each worker's entry."""
    lo, hi = window
    wall = hi - lo
    workers, segments = {}, {}
    first = last = None
    for name in sorted(activity):
        taken: list[tuple[float, float]] = []
        entry: dict[str, Any] = {}
        kept = {}
        for cls in CLASSES:
            mine = union(clip(activity[name].get(cls, ()), lo, hi))
            alone = subtract(mine, taken)
            entry[f"{cls}_s"] = length(alone)
            taken = union(taken + mine)
            kept[cls] = coarsen([(a - lo, b - lo) for a, b in mine], wall / RESOLUTION)
            if cls == "compute" and mine:
                first = mine[0][0] if first is None else min(first, mine[0][0])
                last = mine[-1][1] if last is None else max(last, mine[-1][1])
        entry["transfer_total_s"] = length(union(clip(activity[name].get("transfer", ()), lo, hi)))
        entry["idle_s"] = max(0.0, wall - length(taken))
        entry.update((counts or {}).get(name, {}))
        workers[name] = entry
        segments[name] = kept
    return {
        "wall_s": wall,
        "first_task_s": None if first is None else first - lo,
        "tail_s": None if last is None else hi - last,
        "workers": workers,
        "segments": segments,
    }


# --- capturing one run


def _transfer_log(dask_worker=None) -> list[dict]:
    return [{"start": e["start"], "stop": e["stop"], "bytes": e["total"], "who": e["who"]}
            for e in dask_worker.transfer_incoming_log]


def in_window(transfer: dict, window: tuple[float, float]) -> bool:
    """Whether a worker's logged transfer belongs to the timed window: it overlaps it. The
    bench's byte count and the timeline's both take this one rule, so a transfer that ended
    just before the clock started (or began after it stopped) is in neither or in both."""
    lo, hi = window
    return transfer["stop"] > lo and transfer["start"] < hi


def from_records(window: tuple[float, float], tasks: list[dict], transfers: dict[str, list[dict]],
                 workers: list[str]) -> dict:
    """:func:`summarize` over the scheduler's task stream and the workers' transfer logs."""
    lo, hi = window
    activity: dict[str, dict[str, list]] = {w: {c: [] for c in CLASSES} for w in workers}
    counts = {w: {"tasks": 0, "transfers": 0, "bytes_in": 0} for w in workers}
    for task in tasks:
        worker = task.get("worker")
        if worker not in activity:
            continue
        ran = False
        for ss in task.get("startstops", ()):
            if ss["stop"] <= lo or ss["start"] >= hi:
                continue
            if ss["action"] == "compute":
                activity[worker]["compute"].append((ss["start"], ss["stop"]))
                ran = True
            elif ss["action"] != "transfer":  # transfers come from the workers' own logs
                activity[worker]["other"].append((ss["start"], ss["stop"]))
        counts[worker]["tasks"] += ran
    for worker, log in transfers.items():
        if worker not in activity:
            continue
        for t in log:
            if in_window(t, window):
                activity[worker]["transfer"].append((t["start"], t["stop"]))
                counts[worker]["transfers"] += 1
                counts[worker]["bytes_in"] += int(t["bytes"])
    out = summarize(window, activity, counts)
    # rows in the order of the workers' addresses, named w0, w1, ...
    out["names"] = {w: f"w{i}" for i, w in enumerate(sorted(workers))}
    return out


class Recording:
    """The task stream and the workers' transfer logs, cut to a timed window (:meth:`result`)."""

    def __init__(self, client):
        self.client = client

    def result(self, window: tuple[float, float]) -> dict:
        tasks = self.client.get_task_stream(start=window[0] - 1.0, stop=window[1] + 1.0)
        transfers = self.client.run(_transfer_log)
        return from_records(window, tasks, transfers, sorted(transfers))


@contextlib.contextmanager
def recording(client) -> Iterator[Recording]:
    """Record the task stream of the runs inside the block."""
    client.get_task_stream(start=0, stop=0)  # installs the scheduler's task-stream plugin
    yield Recording(client)


# --- files and rendering


def captured(results: dict) -> list[tuple[str, str, dict]]:
    """``(workload, side, timeline)`` of each captured run in ``results``, in order."""
    return [(w["name"], side, (w.get(side) or {})["timeline"]) for w in results.get("workloads", [])
            for side in SIDES if (w.get(side) or {}).get("timeline")]


def write_files(results: dict, out_dir: Path, name: str) -> dict[str, Path]:
    """``<name>-timeline.png`` of the captured runs in ``results`` (none: no file)."""
    if not captured(results):
        return {}
    paths = {"timeline_png": out_dir / f"{name}-timeline.png"}
    plot(results, paths["timeline_png"])
    return paths


def markdown_section(results: dict) -> list[str]:
    """Per captured run and worker: seconds of compute, transfer, other and idle."""
    runs = captured(results)
    if not runs:
        return []
    lines = ["", "## Timeline of the slowest timed run", "",
             "Per worker: compute (a task running), transfer (a chunk arriving while no task runs), other "
             "(disk reads and such alone), idle (waiting); they add up to the wall time. First task: from the "
             "clock's start to the first task on any worker; tail: from the last task's end to the stop.", "",
             "| workload | side | wall s | first task s | tail s | worker | compute s | transfer s "
             "| (all transfer s) | other s | idle s | tasks | transfers in |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for workload, side, tl in runs:
        names = tl.get("names", {})
        for addr, w in tl["workers"].items():
            lines.append(
                f"| {workload} | {side} | {tl['wall_s']:.3f} | {fmt_value(tl['first_task_s'])} "
                f"| {fmt_value(tl['tail_s'])} "
                f"| {names.get(addr, addr)} | {w['compute_s']:.3f} | {w['transfer_s']:.3f} "
                f"| {w['transfer_total_s']:.3f} | {w['other_s']:.3f} | {w['idle_s']:.3f} "
                f"| {w.get('tasks', '—')} | {w.get('transfers', '—')} |")
    return lines


def plot(results: dict, path: Path) -> None:
    """One panel per captured run, one row per worker: compute, transfer and other bars;
    the gaps are waiting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    runs = captured(results)
    heights = [1.0 + 0.35 * max(1, len(tl["workers"])) for _, _, tl in runs]
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (workload, side, tl) in zip(axes[:, 0], runs):
        names = tl.get("names", {})
        order = sorted(tl["workers"])
        for row, addr in enumerate(order):
            for cls in CLASSES:
                spans = [(a, b - a) for a, b in tl["segments"][addr][cls]]
                if spans:
                    ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=COLORS[cls], linewidth=0)
        ax.set_yticks(range(len(order)), [names.get(a, a) for a in order])
        ax.set_ylim(len(order) - 0.5, -0.5)
        ax.set_xlim(0, tl["wall_s"])
        total = {c: sum(w[f"{c}_s"] for w in tl["workers"].values()) for c in (*CLASSES, "idle")}
        whole = sum(total.values()) or 1.0
        shares = ", ".join(f"{c} {100 * v / whole:.0f}%" for c, v in total.items())
        ax.set_title(f"{workload}, {side}: {tl['wall_s']:.3f} s; {shares}", fontsize=9, loc="left")
        ax.tick_params(labelsize=8)
    axes[-1, 0].set_xlabel("seconds since the run's clock started")
    fig.legend(handles=[Patch(color=COLORS[c], label=c) for c in CLASSES] + [Patch(color="white", label="idle (gap)")],
               loc="upper right", ncol=4, fontsize=8)
    label = f", {results['label']}" if results.get("label") else ""
    fig.suptitle(f"spillway bench timelines on {results.get('machine', {}).get('name', '')}{label}",
                 x=0.01, ha="left", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=90 if len(runs) > 6 else 110)
    plt.close(fig)
