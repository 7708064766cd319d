"""The files made from the option declarations (:data:`spillway.options.settings.OPTIONS`):
the packaged defaults ``config.yaml`` (which dask loads), the JSON schema
``config_schema.yaml`` and the README's configuration table.

They are committed, so that dask, editors and readers find them as files; after changing
an option, regenerate them::

    python -m spillway.options.docs --write

``--check`` (the default) exits 1 naming the files that differ from the declarations;
tests/options/test_config_schema.py fails the same way.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

from spillway.options.settings import DEFAULTS_FILE, NAMESPACE, OPTIONS

#: the JSON schema of the options, packaged for editors (spillway does not read it)
SCHEMA_FILE = DEFAULTS_FILE.with_name("config_schema.yaml")
BEGIN = "<!-- config-table:begin -->"
END = "<!-- config-table:end -->"
#: the README of a source checkout (absent from an installed package)
README = Path(__file__).resolve().parents[2] / "README.md"
COMMAND = "python -m spillway.options.docs --write"

_GENERATED = f"# Generated from the option declarations in spillway/options/settings.py by `{COMMAND}`; do not edit.\n"

_DEFAULTS_HEADER = _GENERATED + """\
# Defaults of every spillway cluster setting, under the `spillway` dask-config namespace.
# Override them in a dask config file, with DASK_SPILLWAY__<KEY> environment variables,
# with CLI flags or with Python keywords (each later source wins).
"""

_SCHEMA_HEADER = _GENERATED + """\
# JSON schema of the `spillway` dask-config namespace, for editors and docs: spillway itself
# checks each value with the option's parser, which this schema's types and bounds come from.
"""


class _Dumper(yaml.SafeDumper):
    """Lists inline (``type: [string, "null"]``), as one would write them by hand."""


_Dumper.add_representer(list, lambda dumper, data: dumper.represent_sequence(
    "tag:yaml.org,2002:seq", data, flow_style=True))


def _dump(data) -> str:
    # one line per value, in declaration order, so a changed option is a one-line diff
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=10_000, allow_unicode=True)


def defaults() -> dict:
    """Each option's default, keyed and written as config files write it."""
    return {o.key: o.config_default for o in OPTIONS}


def schema() -> dict:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "spillway cluster options",
        "type": "object",
        "additionalProperties": False,
        "properties": {o.key: o.schema for o in OPTIONS},
    }


def defaults_yaml() -> str:
    return _DEFAULTS_HEADER + _dump({NAMESPACE: defaults()})


def schema_yaml() -> str:
    return _SCHEMA_HEADER + _dump(schema())


def _shown(value) -> str:
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def config_table() -> str:
    rows = ["| key | flag | default | meaning |", "| --- | --- | --- | --- |"]
    for o in OPTIONS:
        flag = f"{o.flag}/--no-{o.key}" if o.switch else o.flag
        rows.append(f"| `{o.key}` | `{flag}` | `{_shown(o.config_default)}` | {o.help.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def readme_block() -> str:
    return f"{BEGIN}\n{config_table()}\n{END}"


def _with_table(readme: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), flags=re.S)
    if not pattern.search(readme):
        raise ValueError(f"README lacks the configuration table markers {BEGIN} ... {END}")
    return pattern.sub(lambda _: readme_block(), readme, count=1)


def generated() -> dict[Path, str]:
    """Each generated file and the text the declarations give it (the README where it is
    there: a source checkout's)."""
    out = {DEFAULTS_FILE: defaults_yaml(), SCHEMA_FILE: schema_yaml()}
    if README.is_file():
        out[README] = _with_table(README.read_text())
    return out


def stale(files: dict[Path, str]) -> list[Path]:
    """The files whose text differs from ``files``'."""
    return [path for path, text in files.items() if not path.is_file() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spillway.options.docs", description=(
        "Check (exit 1 naming what differs) or --write config.yaml, config_schema.yaml and the README's "
        "table, made from the option declarations in spillway/options/settings.py"))
    parser.add_argument("--write", action="store_true", help="rewrite the files that differ")
    args = parser.parse_args(argv)
    files = generated()
    behind = stale(files)
    if args.write:
        for path in behind:
            path.write_text(files[path])
            print(f"wrote {path}")
        return 0
    for path in behind:
        print(f"{path}: differs from the option declarations; run `{COMMAND}`", file=sys.stderr)
    return 1 if behind else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
