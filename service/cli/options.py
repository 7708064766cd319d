"""Click flags for every cluster option, generated from the options object and its schema.

No flag is written by hand: adding a field to :class:`service.options.Options` (and its
schema) adds the flag, with the schema's description as its help.
"""

from __future__ import annotations

import dataclasses
import functools

import click

from ..options import Options, fields, load_schema


def _flag_type(name: str):
    field = next(f for f in dataclasses.fields(Options) if f.name == name)
    return "bool" if field.type in ("bool", bool) else "value"


def cluster_options(func):
    """Add one flag per option; the command receives them as ``options_flags``."""
    schema = load_schema()["properties"]
    names = fields()

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        flags = {n: kwargs.pop(n) for n in names}
        return func(*args, options_flags=flags, **kwargs)

    for name in reversed(names):
        key = name.replace("_", "-")
        help_text = schema[key]["description"]
        if _flag_type(name) == "bool":
            decl = f"--{key}/--no-{key}"
            wrapper = click.option(decl, name, default=None, help=help_text)(wrapper)
        else:
            wrapper = click.option(f"--{key}", name, default=None, metavar="VALUE", help=help_text)(wrapper)
    return wrapper


def resolve(flags: dict) -> Options:
    return Options.resolve(flags)
