"""Click flags for every cluster option, generated from the options object and its schema.

No flag is written by hand: adding a field to :class:`spillway.service.options.Options` (and its
schema) adds the flag, with the schema's description as its help.
"""

from __future__ import annotations

import dataclasses
import functools
import json

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


def parse_param_pairs(pairs: tuple[str, ...]) -> dict:
    """``K=V`` pairs; V is JSON when it parses as JSON (numbers, lists), else a string."""
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"{pair!r} is not K=V", param_hint="--param")
        key, _, text = pair.partition("=")
        key = key.strip()
        if key in out:
            raise click.BadParameter(f"{key!r} is given twice", param_hint="--param")
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError:
            out[key] = text
    return out


def collect_params(param_pairs: tuple[str, ...], params_json: str | None) -> dict:
    """``--params-json`` as the base, ``--param K=V`` pairs on top."""
    try:
        params = json.loads(params_json) if params_json else {}
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"{params_json[:80]!r} is not JSON ({e.msg} at character {e.pos})",
                                 param_hint="--params-json") from None
    if not isinstance(params, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--params-json")
    params.update(parse_param_pairs(param_pairs))
    return params


def workflow_params(func):
    """WORKFLOW and its parameters (``--param K=V``, ``--params-json``); the command
    receives ``workflow`` and the parsed ``params``."""

    @functools.wraps(func)
    def wrapper(*args, param_pairs, params_json, **kwargs):
        return func(*args, params=collect_params(param_pairs, params_json), **kwargs)

    wrapper = click.option("--params-json", default=None, metavar="JSON",
                           help="All parameters as one JSON object.")(wrapper)
    wrapper = click.option("-p", "--param", "param_pairs", multiple=True, metavar="K=V",
                           help="Workflow parameter (repeatable); values parse as JSON where they can.")(wrapper)
    return click.argument("workflow")(wrapper)
