"""The commands that describe without running: ``spillway info`` (GPUs, links, the stack),
``config`` (the effective options and their sources), ``workflows`` (the catalogue)."""

from __future__ import annotations

import json

import click

from .errors import fail_cleanly
from .group import CONTEXT
from .options import cluster_options, resolve


@click.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print as one JSON object.")
def info(as_json):
    """GPUs, their memory, NVLink links between each pair, driver and CUDA versions, and
    which parts of the GPU stack are installed. Creates no CUDA context.

    \b
    Example:
      spillway info --json
    """
    from spillway.cli.info import collect, format_info

    data = collect()
    click.echo(json.dumps(data, indent=2) if as_json else format_info(data))


@click.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print as one JSON object.")
@cluster_options
@fail_cleanly
def config(as_json, options_flags):
    """The effective cluster options and where each value came from.

    \b
    Examples:
      spillway config
      DASK_SPILLWAY__RMM_POOL_SIZE=20GB spillway config --protocol tcp
    """
    from spillway.options.settings import OPTIONS

    options = resolve(options_flags)
    values = options.as_config()
    # on CPU workers the GPU workers' options are listed all the same, and marked
    cpu_why = _cpu_workers(options)
    rows = {}
    for o in OPTIONS:
        row = {"value": values[o.key], "source": options.sources.get(o.name, "default")}
        if o.gpu and cpu_why:
            row["used"] = False
            row["why"] = f"GPU workers only; CPU workers here: {cpu_why}"
        rows[o.key] = row
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    if cpu_why:
        click.echo(f"# CPU workers here ({cpu_why}): the options marked 'GPU only' are not used")
    width = max(map(len, rows))
    for key, row in rows.items():
        unused = "  (GPU only, not used)" if "why" in row else ""
        click.echo(f"{key:<{width}}  {str(row['value']):<24}  {row['source']}{unused}")


def _cpu_workers(options) -> str | None:
    """Why the workers these options start here would be CPU workers (None where they would
    be GPU workers, or are not started here)."""
    from spillway.options.gpus import discover
    from spillway.launch import cuda_stack_installed

    if options.attach:
        return None
    if options.cpu:
        return "cpu is true"
    inventory = discover()
    if not len(inventory):
        return f"no GPU ({inventory.reason})"
    if not cuda_stack_installed():
        return "dask-cuda/CuPy are not installed"
    return None


@click.command("workflows", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="List of objects with name, description and schema.")
@click.option("--gpu", is_flag=True, help="Show the defaults used on GPU workers.")
def workflows_command(as_json, gpu):
    """List the workflow catalogue.

    \b
    Examples:
      spillway workflows
      spillway workflows --json --gpu
    """
    from spillway import workflows as registry
    from spillway.workflows.params import Target

    target = Target(kind="gpu" if gpu else "cpu")
    entries = registry.catalogue(target)
    if as_json:
        click.echo(json.dumps(entries, indent=2))
        return
    for entry in entries:
        click.echo(f"{entry['name']}\n    {entry['description']}")
        for pname, schema in entry["schema"]["properties"].items():
            inner = schema.get("anyOf", [schema])[0]
            default = schema.get("default", inner.get("default"))
            choices = inner.get("enum")
            allowed = f"one of {', '.join(dict.fromkeys(map(str, choices)))}; " if choices else ""
            click.echo(f"    --param {pname}=...  {schema.get('description', '')} ({allowed}default {default})")
