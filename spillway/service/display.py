"""What notebooks show: HTML tables for jobs and run reports, progress bars, and the
report and benchmark figures in one call.

Everything here reads the JSON the runner, the service and the benchmark already write,
so a report fetched from the service draws the same as one from a local run.
"""

from __future__ import annotations

import functools
import html
import io
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from .sizes import format_bytes

__all__ = ["Report", "job_html", "plot", "progress_bar", "report_html"]

STATE_COLOURS = {"queued": "#6c757d", "running": "#0d6efd", "done": "#198754", "failed": "#dc3545",
                 "cancelled": "#fd7e14"}


# --- progress


def progress_bar(label: str, progress=True):
    """A task bar: tqdm's widget in Jupyter and text on stderr elsewhere (``progress`` is
    True), or a text bar on ``progress`` when it is a stream."""
    options = dict(total=0, desc=label, unit="task", leave=True)
    if progress is True:
        if not in_notebook() and not _isatty(sys.stderr):
            # a redirected log gets no bar: tqdm would write a \r update on every tick
            return None
        from tqdm.auto import tqdm

        return tqdm(**options)
    from tqdm import tqdm

    return tqdm(file=progress, dynamic_ncols=True, **options)


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (where bars are widgets)."""
    shell = sys.modules.get("IPython")
    try:
        ip = shell.get_ipython() if shell is not None else None
    except Exception:  # noqa: BLE001
        return False
    return ip is not None and "IPKernelApp" in getattr(ip, "config", {})


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def advance(bar, done: int, total: int, note: str = "") -> None:
    """Move ``bar`` to ``done`` of ``total`` tasks; totals grow as graphs arrive."""
    total = max(total, done)
    if total != bar.total:
        bar.total = total
        container = getattr(bar, "container", None)
        if container is not None:  # the notebook widget keeps its own maximum
            container.children[1].max = total
    bar.n = done
    if note:
        bar.set_postfix_str(note, refresh=False)
    bar.refresh()


# --- HTML


def _e(value) -> str:
    return html.escape(str(value))


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return "x".join(map(str, value))
    if value is None:
        return "—"
    return str(value)


def _table(title: str, rows: list[tuple[str, str]]) -> str:
    """Rows of (label, HTML value); values are escaped by the caller."""
    body = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{_e(k)}</th>"
                   f"<td style='text-align:left'>{v}</td></tr>" for k, v in rows)
    return f"<table class='spillway'><caption style='text-align:left'><b>{title}</b></caption>{body}</table>"


def _pairs(mapping: Mapping) -> str:
    return ", ".join(f"{_e(k)}={_e(_fmt(v))}" for k, v in mapping.items()) or "—"


def job_html(record: Mapping) -> str:
    """One job of the service (its JSON record) as an HTML table."""
    state = record["state"]
    colour = STATE_COLOURS.get(state, "#000")
    p = record["progress"]
    t = record.get("timings") or {}
    rows = [
        ("workflow", _e(record["workflow"])),
        ("state", f"<span style='color:{colour};font-weight:bold'>{_e(state)}</span>"
                  + (" (cancel requested)" if record.get("cancel_requested") and state == "running" else "")),
        ("progress", f"<progress value='{p['tasks_done']}' max='{max(p['tasks_total'], 1)}'></progress> "
                     f"{p['tasks_done']}/{p['tasks_total']} tasks"),
        *([("waiting", _e(record["waiting"]))] if record.get("waiting") else []),
        ("params", _pairs(record.get("params") or {})),
        ("tenant", _e(record.get("tenant") or "—")),
        ("priority", _e(record.get("priority", 0))),
        ("projected footprint", _e(format_bytes(record.get("footprint_bytes") or 0))),
        ("spilled", _e(format_bytes(record.get("bytes_spilled") or 0))),
        ("created / started / finished", " / ".join(_e(t.get(k) or "—") for k in ("created", "started", "finished"))),
        ("wall time", _e(f"{t['wall_s']:.3f} s" if t.get("wall_s") is not None else "—")),
    ]
    if record.get("error"):
        rows.append(("error", f"<span style='color:{STATE_COLOURS['failed']}'>{_e(record['error'])}</span>"))
    return _table(f"spillway job {_e(record['id'])}", rows)


def report_html(report: Mapping) -> str:
    """A run report (``spillway.service.run.compute.run_workflow``'s dict) as an HTML table."""
    c = report.get("cluster") or {}
    fp = report.get("footprint") or {}
    rows = [
        ("cluster", _e(f"{c.get('n_workers')} {c.get('kind')} workers over {c.get('protocol')}")),
        ("params", _pairs(report.get("params") or {})),
        ("result", _pairs(report.get("result") or {})),
        ("wall time", _e(f"{report['wall_s']:.3f} s ({report.get('tasks', 0)} tasks)")),
        ("input", _e(f"{format_bytes(fp.get('input_bytes', 0))} (projected peak "
                     f"{format_bytes(fp.get('per_worker_bytes', 0))} per worker)")),
        ("read / written", _e(f"{format_bytes(report.get('bytes_read') or 0)} / "
                              f"{format_bytes(report.get('bytes_written') or 0)}")
         + (f" to <code>{_e(report['output'])}</code>" if report.get("output") else "")),
        ("transferred", _e(f"{format_bytes(report.get('bytes_transferred') or 0)} between workers"
                           + (f" (median {report['transfer_gbps_median']:.2f} GB/s)"
                              if report.get("transfer_gbps_median") else ""))),
        ("spilled", _e(format_bytes(report.get("bytes_spilled") or 0))
         + (" (" + _pairs({k.replace("_to_", "→"): format_bytes(v)
                           for k, v in report["spilled_by_tier"].items() if v}) + ")"
            if any((report.get("spilled_by_tier") or {}).values()) else "")),
    ]
    peaks = report.get("peak_bytes_per_worker") or {}
    if peaks:
        rows.append((f"peak memory ({_e(report.get('memory_measure') or 'per worker')})",
                     "<br>".join(f"<code>{_e(a)}</code>: {_e(format_bytes(v) if v is not None else '—')}"
                                 for a, v in peaks.items())))
    host = report.get("peak_host_bytes_per_worker") or {}
    if host and report.get("memory_measure") == "rmm":
        rows.append(("peak host memory (worker RSS)",
                     "<br>".join(f"<code>{_e(a)}</code>: {_e(format_bytes(v) if v is not None else '—')}"
                                 for a, v in host.items())))
    v = report.get("verify")
    if v:
        ok = v.get("ok")
        colour = STATE_COLOURS["done"] if ok else STATE_COLOURS["failed"]
        word = "OK" if ok else ("not checked" if ok is None else "FAILED")
        err = f"relative error {v['rel_error']:.3e} (tolerance {v['tolerance']:.0e})" \
            if v.get("rel_error") is not None else ""
        rows.append(("verify", f"<span style='color:{colour};font-weight:bold'>{word}</span> {_e(err)}"
                               f"<br><small>{_e(v.get('reference') or '')}</small>"))
    return _table(f"spillway run: {_e(report['workflow'])}", rows)


class Report(dict):
    """A run report: the plain JSON-able dict, an HTML table in Jupyter, aligned text in a
    terminal, and ``.plot()`` for its memory and spill figure."""

    def _repr_html_(self) -> str:
        return report_html(self)

    def __str__(self) -> str:
        from .run.text import format_report

        return format_report(self)

    def plot(self, **kw):
        return plot(self, **kw)


# --- figures


def _load(source) -> dict:
    if isinstance(source, (str, os.PathLike)):
        with Path(source).expanduser().open() as f:
            return json.load(f)
    if isinstance(source, Mapping):
        return dict(source)
    raise TypeError(f"plot: expected a report, benchmark results or a JSON file, got {type(source).__name__}")


def plot(source, *, figsize=None):
    """One figure of a run report (memory per worker, bytes moved and spilled) or of
    benchmark results (time and transfer bandwidth per workload), from the dict or its
    JSON file. Returns a matplotlib Figure, which Jupyter shows."""
    data = _load(source)
    if "workloads" in data:
        return _bench_figure(data, figsize or (12, 4.5))
    if "workflow" in data and "wall_s" in data:
        return _report_figure(data, figsize or (11, 4))
    raise ValueError("plot: the data is neither a run report (workflow, wall_s) nor benchmark results (workloads)")


@functools.cache
def _figure_class():
    # matplotlib is imported on the first plot, not with the package
    from matplotlib.figure import Figure

    class PlotFigure(Figure):
        """Shown as an image when it is a cell's value, whether or not pyplot's inline
        backend (which registers Jupyter's figure formatter) was ever loaded."""

        def _repr_png_(self):
            buffer = io.BytesIO()
            self.savefig(buffer, format="png", dpi=100)
            return buffer.getvalue()

    return PlotFigure


def _figure(figsize, ncols):
    # A Figure of its own (not pyplot's): nothing is drawn twice in Jupyter, and nothing
    # is left open in a long-running kernel.
    fig = _figure_class()(figsize=figsize, layout="constrained")
    return fig, fig.subplots(1, ncols)


def _short(address: str) -> str:
    return address.split("://", 1)[-1]


def _unit(*values) -> tuple[float, str]:
    """The decimal unit that keeps the largest of ``values`` readable."""
    top = max([v or 0 for v in values] or [0])
    for scale, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if top >= scale:
            return scale, name
    return 1.0, "bytes"


def _report_figure(report: dict, figsize):
    import numpy as np

    fig, (ax_mem, ax_moved) = _figure(figsize, 2)
    peaks = report.get("peak_bytes_per_worker") or {}
    workers = sorted(set(peaks) | set(report.get("spill") or {}))
    x = np.arange(len(workers))
    projected = (report.get("footprint") or {}).get("per_worker_bytes")
    scale, unit = _unit(projected, *peaks.values())
    ax_mem.bar(x, [(peaks.get(w) or 0) / scale for w in workers], width=0.6, label="peak")
    if projected:
        ax_mem.axhline(projected / scale, color="black", linestyle="--", linewidth=1, label="projected per worker")
    ax_mem.set_xticks(x, [_short(w) for w in workers], rotation=20, fontsize=8)
    ax_mem.set_ylabel(unit)
    ax_mem.set_title(f"peak memory per worker ({report.get('memory_measure') or 'measured'})")
    ax_mem.legend(fontsize=8)

    spill = report.get("spill") or {}
    if spill:  # the tiered store's moves, per worker
        moves = sorted({m for s in spill.values() for m in s["moves"]})
        per_worker = [sum((v or {}).get("bytes", 0) for v in (spill.get(w) or {}).get("moves", {}).values())
                      for w in workers]
        scale, unit = _unit(*per_worker)
        bottom = np.zeros(len(workers))
        for move in moves:
            values = np.array([((spill.get(w) or {}).get("moves", {}).get(move) or {}).get("bytes", 0) / scale
                               for w in workers])
            ax_moved.bar(x, values, width=0.6, bottom=bottom, label=move.replace("_to_", "→"))
            bottom += values
        ax_moved.set_xticks(x, [_short(w) for w in workers], rotation=20, fontsize=8)
        ax_moved.set_title("bytes spilled and restored per worker")
    else:
        tiers = {k.replace("_to_", "→"): v for k, v in (report.get("spilled_by_tier") or {}).items()}
        labels = ["transferred", *tiers]
        raw = [report.get("bytes_transferred") or 0, *tiers.values()]
        scale, unit = _unit(*raw)
        values = [v / scale for v in raw]
        ax_moved.bar(np.arange(len(labels)), values, width=0.6, color="tab:orange")
        ax_moved.set_xticks(np.arange(len(labels)), labels, fontsize=8)
        ax_moved.set_title("bytes moved between workers and spilled")
    ax_moved.set_ylabel(unit)
    ax_moved.set_ylim(bottom=0)
    if spill:
        ax_moved.legend(fontsize=8)
    c = report.get("cluster") or {}
    fig.suptitle(f"{report['workflow']}: {report['wall_s']:.2f} s on {c.get('n_workers')} {c.get('kind')} workers, "
                 f"{format_bytes((report.get('footprint') or {}).get('input_bytes', 0))} in, "
                 f"{format_bytes(report.get('bytes_transferred') or 0)} between workers, "
                 f"{format_bytes(report.get('bytes_spilled') or 0)} spilled")
    return fig


def _bench_figure(results: dict, figsize):
    import numpy as np

    fig, (ax_t, ax_b) = _figure(figsize, 2)
    ws = results["workloads"]
    names = [w["name"] for w in ws]
    x = np.arange(len(ws))
    for offset, side in ((-0.2, "spillway"), (0.2, "baseline")):
        ax_t.bar(x + offset, [w.get(f"{side}_s") or 0 for w in ws], width=0.4, label=side)
    for i, w in enumerate(ws):
        if w.get("speedup"):
            top = max(w.get("spillway_s") or 0, w.get("baseline_s") or 0)
            ax_t.annotate(f"{w['speedup']:.2f}x", (i, top), ha="center", va="bottom", fontsize=8)
    ax_t.set_xticks(x, names)
    ax_t.set_ylabel("wall time, median (s)")
    ax_t.set_title("time per workload (lower is better)")
    ax_t.legend(fontsize=8)
    for offset, side in ((-0.2, "spillway"), (0.2, "baseline")):
        ax_b.bar(x + offset, [(w.get(side) or {}).get("transfer_gbps_median") or 0 for w in ws], width=0.4,
                 label=side)
    peer = (results.get("ceilings") or {}).get("peer_copy")
    if peer:
        ax_b.axhline(peer, color="black", linestyle="--", linewidth=1, label=f"peer copy {peer:.0f} GB/s")
    ax_b.set_xticks(x, names)
    ax_b.set_ylabel("worker-to-worker GB/s, median")
    ax_b.set_title("transfer bandwidth")
    ax_b.legend(fontsize=8)
    machine = (results.get("machine") or {}).get("name", "")
    fig.suptitle(f"spillway bench on {machine} ({results.get('sizes', '')} sizes)")
    return fig
