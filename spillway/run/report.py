"""A run report for people in a notebook: :class:`Report` (the plain JSON-able dict, an
HTML table in Jupyter, aligned text in a terminal) and its memory and spill figure.

Everything here reads the JSON the run writes, so a report fetched from the service draws
the same as one from a local run."""

from __future__ import annotations

from collections.abc import Mapping

from .figures import decimal_bytes, decimal_unit, load, new_figure, short_address
from .html_tables import STATE_COLOURS, escape, pairs, table
from spillway.options.sizes import format_bytes
from .text import format_report


def report_html(report: Mapping) -> str:
    """A run report (``spillway.run.compute.run_workflow``'s dict) as an HTML table."""
    c = report.get("cluster") or {}
    fp = report.get("footprint") or {}
    rows = [
        ("cluster", escape(f"{c.get('n_workers')} {c.get('kind')} workers over {c.get('protocol')}")),
        ("params", pairs(report.get("params") or {})),
        ("result", pairs(report.get("result") or {})),
        ("wall time", escape(f"{report['wall_s']:.3f} s ({report.get('tasks', 0)} tasks)")),
        ("input", escape(f"{format_bytes(fp.get('input_bytes', 0))} (projected peak "
                     f"{format_bytes(fp.get('per_worker_bytes', 0))} per worker)")),
        ("read / written", escape(f"{format_bytes(report.get('bytes_read') or 0)} / "
                              f"{format_bytes(report.get('bytes_written') or 0)}")
         + (f" to <code>{escape(report['output'])}</code>" if report.get("output") else "")),
        ("transferred", escape(f"{format_bytes(report.get('bytes_transferred') or 0)} between workers"
                           + (f" (median {report['transfer_gbps_median']:.2f} GB/s)"
                              if report.get("transfer_gbps_median") else ""))),
        ("spilled", escape(format_bytes(report.get("bytes_spilled") or 0))
         + (" (" + pairs({k.replace("_to_", "→"): format_bytes(v)
                           for k, v in report["spilled_by_tier"].items() if v}) + ")"
            if any((report.get("spilled_by_tier") or {}).values()) else "")),
    ]
    peaks = report.get("peak_bytes_per_worker") or {}
    if peaks:
        rows.append((f"peak memory ({escape(report.get('memory_measure') or 'per worker')})",
                     "<br>".join(f"<code>{escape(a)}</code>: {escape(format_bytes(v) if v is not None else '—')}"
                                 for a, v in peaks.items())))
    host = report.get("peak_host_bytes_per_worker") or {}
    if host and report.get("memory_measure") == "rmm":
        rows.append(("peak host memory (worker RSS)",
                     "<br>".join(f"<code>{escape(a)}</code>: {escape(format_bytes(v) if v is not None else '—')}"
                                 for a, v in host.items())))
    v = report.get("verify")
    if v:
        ok = v.get("ok")
        colour = STATE_COLOURS["done"] if ok else STATE_COLOURS["failed"]
        word = "OK" if ok else ("not checked" if ok is None else "FAILED")
        err = f"relative error {v['rel_error']:.3e} (tolerance {v['tolerance']:.0e})" \
            if v.get("rel_error") is not None else ""
        rows.append(("verify", f"<span style='color:{colour};font-weight:bold'>{word}</span> {escape(err)}"
                               f"<br><small>{escape(v.get('reference') or '')}</small>"))
    return table(f"spillway run: {escape(report['workflow'])}", rows)


class Report(dict):
    """A run report: the plain JSON-able dict, an HTML table in Jupyter, aligned text in a
    terminal, and ``.plot()`` for its memory and spill figure."""

    def _repr_html_(self) -> str:
        return report_html(self)

    def __str__(self) -> str:
        return format_report(self)

    def plot(self, **kw):
        return plot(self, **kw)


def plot(source, *, figsize=None):
    """One figure of a run report (memory per worker, bytes moved and spilled), from the
    dict or its JSON file. Returns a matplotlib Figure, which Jupyter shows. Benchmark
    results are drawn by :func:`spillway_bench.figure.plot`."""
    data = load(source, "a run report")
    if "workflow" in data and "wall_s" in data:
        return _report_figure(data, figsize or (11, 4))
    if "workloads" in data:
        raise ValueError("plot: the data is benchmark results (workloads): spillway_bench.figure.plot draws them")
    raise ValueError("plot: the data is not a run report (workflow, wall_s)")


def _report_figure(report: dict, figsize):
    import numpy as np

    fig, (ax_mem, ax_moved) = new_figure(figsize, 2)
    peaks = report.get("peak_bytes_per_worker") or {}
    workers = sorted(set(peaks) | set(report.get("spill") or {}))
    x = np.arange(len(workers))
    projected = (report.get("footprint") or {}).get("per_worker_bytes")
    scale, unit = decimal_unit(projected, *peaks.values())
    ax_mem.bar(x, [(peaks.get(w) or 0) / scale for w in workers], width=0.6, label="peak")
    if projected:
        ax_mem.axhline(projected / scale, color="black", linestyle="--", linewidth=1, label="projected per worker")
    ax_mem.set_xticks(x, [short_address(w) for w in workers], rotation=20, fontsize=8)
    ax_mem.set_ylabel(unit)
    ax_mem.set_title(f"peak memory per worker ({report.get('memory_measure') or 'measured'})")
    ax_mem.legend(fontsize=8)

    spill = report.get("spill") or {}
    if spill:  # the tiered store's moves, per worker
        moves = sorted({m for s in spill.values() for m in s["moves"]})
        per_worker = [sum((v or {}).get("bytes", 0) for v in (spill.get(w) or {}).get("moves", {}).values())
                      for w in workers]
        scale, unit = decimal_unit(*per_worker)
        bottom = np.zeros(len(workers))
        for move in moves:
            values = np.array([((spill.get(w) or {}).get("moves", {}).get(move) or {}).get("bytes", 0) / scale
                               for w in workers])
            ax_moved.bar(x, values, width=0.6, bottom=bottom, label=move.replace("_to_", "→"))
            bottom += values
        ax_moved.set_xticks(x, [short_address(w) for w in workers], rotation=20, fontsize=8)
        ax_moved.set_title("bytes spilled and restored per worker")
    else:
        tiers = {k.replace("_to_", "→"): v for k, v in (report.get("spilled_by_tier") or {}).items()}
        labels = ["transferred", *tiers]
        raw = [report.get("bytes_transferred") or 0, *tiers.values()]
        scale, unit = decimal_unit(*raw)
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
                 f"{decimal_bytes((report.get('footprint') or {}).get('input_bytes', 0))} in, "
                 f"{decimal_bytes(report.get('bytes_transferred') or 0)} between workers, "
                 f"{decimal_bytes(report.get('bytes_spilled') or 0)} spilled")
    return fig
