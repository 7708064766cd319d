"""Where a timed run's time goes on each worker: compute, incoming transfers, and waiting.

With ``--timeline`` the bench records every timed run of every workload on each side and
keeps the slowest (a stall is what a timeline is read for):
the scheduler's task stream (each task's compute interval on its worker) and the workers'
incoming-transfer logs, cut to the run's clock. Per worker the run's wall time splits
into ``compute_s`` (some task running), ``transfer_s`` (a chunk arriving while no task
runs), ``other_s`` (the task stream's other actions, such as disk reads, alone) and
``idle_s`` (none of these: waiting on the scheduler, on a peer, or on the device), so the
four add up to the wall time. ``first_task_s`` is the time from the clock's start to the
first task on any worker (submitting and scheduling the graph), ``tail_s`` from the last
task's end to the clock's stop (gathering the futures' states and synchronising).

The files stay few and small, since what comes back from the GPU host is limited in
count and size: one PNG for the whole results file (a panel per workload and side, a row
per worker) drawn from the intervals kept in the JSON, and, where bokeh is installed,
one HTML holding distributed's performance report of each captured run.
"""

from __future__ import annotations

import contextlib
import html
import importlib.util
import re
import time
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
#: the combined performance reports stop taking sections beyond this size
HTML_LIMIT = 12 * 2**20
#: where the performance reports travel in the results until the writer takes them out
REPORT_KEY = "_performance_report"

_SECTION = re.compile(r"<!-- section (\S+) (\S+) -->\n(.*?)<!-- /section -->\n", re.S)


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


def _monitor_count(dask_scheduler=None) -> int:
    return dask_scheduler.monitor.count


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
    """What :func:`recording` gathered; :meth:`result` cuts it to the timed window."""

    def __init__(self, client):
        self.client = client
        self.monitor_count = client.run_on_scheduler(_monitor_count)
        self.started = time.time()
        self.report_note = None
        self._report = None

    def result(self, window: tuple[float, float]) -> dict:
        client = self.client
        tasks = client.get_task_stream(start=window[0] - 1.0, stop=window[1] + 1.0)
        transfers = client.run(_transfer_log)
        out = from_records(window, tasks, transfers, sorted(transfers))
        out["performance_report"] = self.report_note or "included"
        if self._report is not None:
            out[REPORT_KEY] = self._report
        return out

    def write_report(self) -> None:
        """distributed's performance report of the run (it needs bokeh on the scheduler)."""
        if importlib.util.find_spec("bokeh") is None:
            self.report_note = "not written: bokeh is not installed (pip install bokeh)"
            return
        try:
            self._report = self.client.sync(
                self.client.scheduler.performance_report, start=self.started,
                last_count=self.monitor_count, code="spillway bench: a timed run of the workload")
        except Exception as e:  # the timeline must not fail the benchmark
            self.report_note = f"not written: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


@contextlib.contextmanager
def recording(client) -> Iterator[Recording]:
    """Record the task stream (and, after the block, the performance report) of the runs
    inside the block; the report is built after the run's clock has stopped."""
    client.get_task_stream(start=0, stop=0)  # installs the scheduler's task-stream plugin
    rec = Recording(client)
    yield rec
    rec.write_report()


# --- files and rendering


def captured(results: dict) -> list[tuple[str, str, dict]]:
    """``(workload, side, timeline)`` of each captured run in ``results``, in order."""
    workloads = results.get("workloads")
    if not isinstance(workloads, list):  # the scaling report holds rows per workload
        return []
    return [(w["name"], side, (w.get(side) or {})["timeline"]) for w in workloads
            for side in SIDES if (w.get(side) or {}).get("timeline")]


def write_files(results: dict, out_dir: Path, name: str) -> dict[str, Path]:
    """``<name>-timeline.png`` (and ``-timeline.html`` with the performance reports) for
    the captured runs in ``results``; takes the reports out of ``results`` first, so the
    JSON keeps only their file's name. Sections already in the HTML (an earlier part of a
    merged results file) are kept where this run did not replace them."""
    runs = captured(results)
    if not runs:
        return {}
    paths = {"timeline_png": out_dir / f"{name}-timeline.png"}
    html_path = out_dir / f"{name}-timeline.html"
    sections = _read_sections(html_path)
    for workload, side, tl in runs:
        report = tl.pop(REPORT_KEY, None)
        if report is not None:
            sections[(workload, side)] = _section(workload, side, report)
    order = [(w, s) for w, s, _ in runs]
    kept, size = [], 0
    for key in order + [k for k in sections if k not in order]:
        if key in sections and size + len(sections[key]) <= HTML_LIMIT:
            kept.append(key)
            size += len(sections[key])
    for workload, side, tl in runs:
        if (workload, side) in kept:
            tl["performance_report"] = html_path.name
        elif (workload, side) in sections:
            tl["performance_report"] = f"left out of {html_path.name}: over its {HTML_LIMIT // 2**20} MiB"
    if kept:
        html_path.write_text(_page(results, [(k, sections[k]) for k in kept]))
        paths["timeline_html"] = html_path
    plot(results, paths["timeline_png"])
    return paths


def _section(workload: str, side: str, report: str) -> str:
    return (f"<!-- section {workload} {side} -->\n<h2>{workload}, {side}</h2>\n"
            f"<iframe srcdoc=\"{html.escape(report, quote=True)}\"></iframe>\n<!-- /section -->\n")


def _read_sections(path: Path) -> dict[tuple[str, str], str]:
    if not path.exists():
        return {}
    return {(m.group(1), m.group(2)): m.group(0) for m in _SECTION.finditer(path.read_text())}


def _page(results: dict, sections: list[tuple[tuple[str, str], str]]) -> str:
    title = f"spillway bench timelines: {results.get('machine', {}).get('name', '')}"
    return ("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>" + html.escape(title) + "</title>\n"
            "<style>iframe{width:100%;height:1400px;border:1px solid #ccc}</style></head><body>\n"
            f"<h1>{html.escape(title)}</h1>\n<p>distributed's performance report of each workload's first "
            "timed run (it loads Bokeh from its CDN).</p>\n"
            + "".join(s for _, s in sections) + "</body></html>\n")


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
