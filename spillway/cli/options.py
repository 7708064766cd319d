"""Click flags for every cluster option, made from the option declarations.

No flag is written by hand: declaring an option on :class:`spillway.options.settings.Options`
adds its flag (``--key``, or ``--key/--no-key`` for a boolean) with the declared help.
"""

from __future__ import annotations

import functools
import json
import re

import click

from spillway.options.settings import OPTIONS, Options


def first_sentence(text: str) -> str:
    """The help's first sentence, for the flags of a command whose own help comes first."""
    found = re.match(r"(.+?[.])(?:\s|$)", text, re.S)
    return found.group(1) if found else text


def cluster_options(func=None, *, brief: bool = False):
    """Add one flag per option; the command receives them as ``options_flags`` (None
    where a flag was not given). ``brief``: only the options people commonly change are
    shown, each by the first sentence of its help; every other flag is still accepted,
    hidden from the help (the whole list: ``spillway config --help``, and the README's
    table)."""
    if func is None:
        return functools.partial(cluster_options, brief=brief)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        flags = {o.name: kwargs.pop(o.name) for o in OPTIONS}
        return func(*args, options_flags=flags, **kwargs)

    for o in reversed(OPTIONS):
        text = first_sentence(o.help) if brief else o.help
        hidden = brief and not o.common
        if o.switch:
            wrapper = click.option(f"{o.flag}/--no-{o.key}", o.name, default=None, help=text, hidden=hidden)(wrapper)
        else:
            wrapper = click.option(o.flag, o.name, default=None, metavar="VALUE", help=text,
                                   hidden=hidden)(wrapper)
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
