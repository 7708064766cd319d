"""``spillway bench-scaling``: the bench's workloads at 2, 4 and 8 workers, weak and strong."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from .errors import fail_cleanly
from .group import CONTEXT
from .options import cluster_options, resolve


@click.group("bench-scaling", context_settings=CONTEXT)
def bench_scaling():
    """How time and worker-to-worker bandwidth scale with the worker count.

    Run `bench-scaling run` once per worker count (one host, 2, 4 and 8 GPUs), then
    `bench-scaling report` over the JSON files, on any machine.

    \b
    Examples:
      spillway bench-scaling run --mode weak --sizes full
      spillway bench-scaling run --mode strong --sizes full --devices 0,1,2,3
      spillway bench-scaling report benchmarks/results/scaling/*-weak-n*.json
    """


@bench_scaling.command("run", context_settings=CONTEXT)
@click.option("--mode", type=click.Choice(["weak", "strong", "both"]), required=True,
              help="weak: data per worker fixed at the 2-worker size; strong: total data fixed; both: "
                   "weak, then strong within the same --budget (on 2 workers, where the sizes are the "
                   "same, one run serves both).")
@click.option("--sizes", type=click.Choice(["auto", "tiny", "small", "full"]), default="auto",
              show_default=True, help="The bench's scale the study starts from (auto: small on GPUs, tiny on CPU).")
@click.option("--only", default=None, metavar="W1,B2",
              help="Workloads of the study to run (W1 ... W5, B2); default all of them.")
@click.option("--runs", type=click.IntRange(min=3), default=3, show_default=True,
              help="Timed runs per workload after one warm-up; the median is reported.")
@click.option("--timeout", type=click.FloatRange(min=1), default=120, show_default=True,
              help="Seconds one run may take before the workload counts as failed.")
@click.option("--budget", type=click.FloatRange(min=0), default=540, show_default=True,
              help="Seconds after which no further part of the study starts (a started part finishes; "
                   "each finished part is already written), so the command ends inside a time limit; with "
                   "--mode both, strong starts only if what is left is at least weak's first part's time.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="benchmarks/results/scaling",
              show_default=True, help="Directory for <machine>-<date>-<mode>-n<N>.{json,md,png,log}.")
@click.option("--no-ceilings", is_flag=True, help="Skip measuring the hardware ceilings.")
@click.option("--timeline", is_flag=True,
              help="Record each workload's slowest timed run: per worker, seconds of compute, transfer and "
                   "waiting in the JSON and markdown, and <name>-timeline.png / .html beside the results "
                   "(as in spillway bench --timeline).")
@cluster_options
@fail_cleanly
def run(mode, sizes, only, runs, timeout, budget, out_dir, no_ceilings, timeline, options_flags):
    """Run the study's workloads on this machine's workers at the sizes for their count.

    spillway's side only (the baseline is not what scales here); the cluster flags work as
    in `spillway bench` (--devices picks the GPUs, so one 8-GPU host can run 2, 4 and 8).

    \b
    Examples:
      spillway bench-scaling run --mode both --sizes full               # all GPUs
      spillway bench-scaling run --mode weak --sizes full --devices 0,1,2,3
      spillway bench-scaling run --cpu --n-workers 2 --mode weak --sizes tiny --only W1
      spillway bench-scaling run --mode weak --sizes full --only W1,W2,W5,B2 --timeline
    """
    from spillway_bench.ceilings import not_measured
    from spillway_bench.report import short_table
    from spillway_bench.scaling import run_study

    measure = not_measured if no_ceilings else None
    options = resolve(options_flags)
    started = time.monotonic()
    problems = []
    served: set[str] = set()
    need = 0.0  # strong's sizes are no larger than weak's: its first part takes no longer than weak's
    for one in (["weak", "strong"] if mode == "both" else [mode]):
        if one in served:
            continue
        left = budget - (time.monotonic() - started)
        if served and left < max(need, 1e-9):
            problems.append(f"{one} scaling not started: {max(left, 0):.0f} s of the {budget:.0f} s budget "
                            f"were left, the first part took {need:.0f} s")
            continue
        results, paths = run_study(options, mode=one, sizes=sizes, only=only, runs=runs, timeout=timeout,
                                   out_dir=Path(out_dir), budget_s=max(0.0, left), stream=sys.stderr,
                                   measure_ceilings=measure, timeline=timeline)
        served.update(results["scaling"]["modes"])
        need = results["scaling"]["parts"][0]["seconds"] if results["scaling"]["parts"] else 0.0
        click.echo(short_table(results))
        click.echo(f"{one} scaling on {results['scaling']['workers']} workers "
                   f"(serves {', '.join(results['scaling']['modes'])}): {paths['json']}")
        failed = [w["name"] for w in results["workloads"] if (w.get("spillway") or {}).get("error")]
        if failed:
            problems.append(f"{one}: failed workloads {', '.join(failed)} (see the log)")
        if results["scaling"]["skipped"]:
            problems.append(f"{one}: not started (budget): {', '.join(results['scaling']['skipped'])}")
    if problems:
        click.echo("spillway: " + "; ".join(problems), err=True)
        sys.exit(1)


@bench_scaling.command("report", context_settings=CONTEXT)
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Directory for the combined markdown, JSON and PNG (default: the first file's).")
@fail_cleanly
def report(files, out_dir):
    """Combine the JSON of several runs (one per worker count, one mode) into a table per
    workload: time, time relative to the fewest workers, parallel efficiency, transfer
    bandwidth and bytes moved; writes markdown, JSON and a PNG. Needs no GPU.

    \b
    Example:
      spillway bench-scaling report benchmarks/results/scaling/*-weak-n*.json
    """
    from spillway_bench.scaling import combine, load_runs, text_table, write_report

    mode, runs = load_runs(files)
    combined = combine(mode, runs)
    click.echo(text_table(combined), nl=False)
    paths = write_report(combined, Path(out_dir) if out_dir else Path(files[0]).parent)
    for path in paths.values():
        click.echo(f"wrote {path}")
