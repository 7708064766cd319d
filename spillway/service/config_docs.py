"""The README's configuration table, generated from the schema and the defaults."""

from __future__ import annotations

from .options import load_defaults, load_schema

BEGIN = "<!-- config-table:begin -->"
END = "<!-- config-table:end -->"


def config_table() -> str:
    schema = load_schema()["properties"]
    defaults = load_defaults()
    rows = ["| key | flag | default | meaning |", "| --- | --- | --- | --- |"]
    for key, spec in schema.items():
        default = defaults[key]
        shown = "null" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
        desc = spec["description"].replace("|", "\\|")
        rows.append(f"| `{key}` | `--{key}` | `{shown}` | {desc} |")
    return "\n".join(rows)


def readme_block() -> str:
    return f"{BEGIN}\n{config_table()}\n{END}"
