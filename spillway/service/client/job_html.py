"""One job of the service (its JSON record) as an HTML table, for notebooks."""

from __future__ import annotations

from collections.abc import Mapping

from spillway.run.html_tables import STATE_COLOURS, escape, pairs, table
from spillway.options.sizes import format_bytes


def job_html(record: Mapping) -> str:
    """One job of the service (its JSON record) as an HTML table."""
    state = record["state"]
    colour = STATE_COLOURS.get(state, "#000")
    p = record["progress"]
    t = record.get("timings") or {}
    rows = [
        ("workflow", escape(record["workflow"])),
        ("state", f"<span style='color:{colour};font-weight:bold'>{escape(state)}</span>"
                  + (" (cancel requested)" if record.get("cancel_requested") and state == "running" else "")),
        ("progress", f"<progress value='{p['tasks_done']}' max='{max(p['tasks_total'], 1)}'></progress> "
                     f"{p['tasks_done']}/{p['tasks_total']} tasks"),
        *([("waiting", escape(record["waiting"]))] if record.get("waiting") else []),
        ("params", pairs(record.get("params") or {})),
        ("tenant", escape(record.get("tenant") or "—")),
        ("priority", escape(record.get("priority", 0))),
        ("projected footprint", escape(format_bytes(record.get("footprint_bytes") or 0))),
        ("spilled", escape(format_bytes(record.get("bytes_spilled") or 0))),
        ("created / started / finished", " / ".join(escape(t.get(k) or "—") for k in ("created", "started", "finished"))),
        ("wall time", escape(f"{t['wall_s']:.3f} s" if t.get("wall_s") is not None else "—")),
    ]
    if record.get("error"):
        rows.append(("error", f"<span style='color:{STATE_COLOURS['failed']}'>{escape(record['error'])}</span>"))
    return table(f"spillway job {escape(record['id'])}", rows)
