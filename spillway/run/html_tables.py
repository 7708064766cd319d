"""HTML tables of JSON records (jobs, run reports) for notebooks: escaped values, state
colours, one caption and label/value rows."""

from __future__ import annotations

import html
from collections.abc import Mapping


STATE_COLOURS = {"queued": "#6c757d", "running": "#0d6efd", "done": "#198754", "failed": "#dc3545",
                 "cancelled": "#fd7e14"}


def escape(value) -> str:
    return html.escape(str(value))


def fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return "x".join(map(str, value))
    if value is None:
        return "—"
    return str(value)


def table(title: str, rows: list[tuple[str, str]]) -> str:
    """Rows of (label, HTML value); values are escaped by the caller."""
    body = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{escape(k)}</th>"
                   f"<td style='text-align:left'>{v}</td></tr>" for k, v in rows)
    return f"<table class='spillway'><caption style='text-align:left'><b>{title}</b></caption>{body}</table>"


def pairs(mapping: Mapping) -> str:
    return ", ".join(f"{escape(k)}={escape(fmt(v))}" for k, v in mapping.items()) or "—"
