"""``spillway bench``: spillway's cluster against the plain dask-cuda baseline."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from spillway.options.errors import ParamError
from .errors import fail_cleanly
from .interrupts import stopped_as
from .group import CONTEXT
from .options import cluster_options, resolve


@click.command(context_settings=CONTEXT)
@click.option("--only", default=None, metavar="W1,B2",
              help="Comma-separated workloads to run (W1 ... W5, O3 ... O5, B1 ... B5); default all but B3, B4 and "
                   "B5 (out of core and checked against NumPy, minutes at full size: name them to run them). "
                   "O3, O4 and O5 (a user's rechunk, FFT and map_overlap past the GPUs' memory) run each side on a "
                   "fresh cluster: spillway, spillway with dask's task-based rechunk or halos, and the baseline.")
@click.option("--sizes", type=click.Choice(["auto", "tiny", "small", "full"]), default="auto",
              show_default=True,
              help="full: the issue's sizes; small: minutes on two GPUs; tiny: the CPU smoke run. "
                   "auto is small on GPUs, tiny on CPU workers.")
@click.option("--runs", type=click.IntRange(min=3), default=3, show_default=True,
              help="Timed runs per workload and side, after one warm-up (O3 ... O5: after the first run on "
                   "the side's fresh cluster, reported as first_s); the median is reported.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="benchmarks/results",
              show_default=True, help="Directory for <machine>-<date>[-<label>].{json,md,png,log}.")
@click.option("--timeout", type=click.FloatRange(min=1), default=900, show_default=True,
              help="Seconds one run may take before it counts as failed.")
@click.option("--no-ceilings", is_flag=True, help="Skip measuring the hardware ceilings.")
@click.option("--merge-into", type=click.Path(exists=True, dir_okay=False), default=None, metavar="FILE",
              help="Add these workloads to an earlier results JSON of this machine (same sizes and "
                   "runs), rewriting its JSON, markdown and plot; its ceilings are used.")
@click.option("--previous", type=click.Path(exists=True), default=None, metavar="PATH",
              help="Results file, or directory of them, to compare this run with: the newest results of this "
                   "machine there (files git tracks, in a git work tree) and every row more than 10% slower "
                   "are recorded and printed last. Default: the --out directory.")
@click.option("--no-baseline", is_flag=True,
              help="Run spillway's side only (the results record the baseline as skipped), to compare "
                   "one transfer-path step with the previous step's results file.")
@click.option("--first-side", type=click.Choice(["spillway", "tasks_method", "baseline"]), default="spillway",
              show_default=True,
              help="The side whose cluster starts first (the others follow in their order). On a freshly "
                   "started host the first side alone meets the host's first touch of its memory.")
@click.option("--label", default=None, metavar="TEXT",
              help="A short name for this run ([A-Za-z0-9_.-], at most 40), kept in the JSON and added to "
                   "the file names, so several runs in one session keep their own files.")
@click.option("--timeline", is_flag=True,
              help="Record each workload's slowest timed run on each side: per worker, seconds of compute, "
                   "transfer and waiting in the JSON and markdown, and <name>-timeline.png (a row per worker).")
@click.option("--link-sweep", is_flag=True,
              help="Measure the link instead of the workloads: peer copy both ways, UCXX send/receive and "
                   "pinned host <-> GPU copies (host copy on CPU workers) at each message size; writes "
                   "<machine>-<date>-link.{json,md,png}.")
@click.option("--sweep-sizes", default=None, metavar="SIZES",
              help="Message sizes of --link-sweep, comma-separated (default 8MiB,32MiB,128MiB,256MiB,"
                   "512MiB,1GiB,2GiB).")
@click.option("--zarr", "zarr_io", is_flag=True,
              help="Measure Zarr I/O instead of the workloads: the workers write two float32 stores, "
                   "uncompressed and sharded zstd (100 GB each at --sizes full, 12 GB small, 61 MB tiny), into "
                   "--local-directory and read them back into chunks (CuPy on GPUs, zstd decoded by nvCOMP), cold "
                   "and page-cached, against the disk and host-copy ceilings, with the GPU decode rate; writes "
                   "<machine>-<date>-zarr.{json,md,png}.")
@click.option("--matrix", "matrix_slice", default=None, metavar="SLICE",
              help="Run the out-of-core matrix instead of the workloads: a slice (1 ... 12, the order to run "
                   "them in), 'all', or case ids separated by commas (cli-fft,user-code-qr); each case sized to "
                   "1.3x the GPUs' memory, checked against NumPy, with its copy bound. Adds its rows to "
                   "<out>/<machine>-<date>-ooc-matrix.{json,md,png} after every case.")
@click.option("--matrix-merge", type=click.Path(exists=True, file_okay=False), default=None, metavar="DIR",
              help="Join every *-ooc-matrix.json under DIR (slices fetched from separate device calls) into "
                   "the matrix file of their machine and first day in --out.")
@click.option("--budget", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="With --matrix: no case starts after this many seconds (it gets a row saying so), so a "
                   "slice ends inside a device call's limit.")
@cluster_options
@fail_cleanly
@stopped_as("the benchmarks and their clusters")
def bench(only, sizes, runs, out_dir, timeout, no_ceilings, merge_into, previous, no_baseline, first_side, label,
          timeline,
          link_sweep, sweep_sizes, zarr_io, matrix_slice, matrix_merge, budget, options_flags):
    """Run each workload on spillway's cluster and on plain LocalCUDACluster(protocol="ucx")
    (plain LocalCluster on CPU), and report times, speedups, transfer bandwidth against the
    hardware ceilings, bytes moved and spilled. O3, O4 and O5 also run on spillway's cluster
    with dask's task-based rechunk or halos, each side on a fresh cluster whose first run is
    reported, beside the bound of the bytes the run moved and of the bytes its capacities
    force.
    Rows more than 10% slower than in the previous result of this machine are printed last.

    The cluster flags configure spillway's side; where they leave a value unset, the bench
    uses an RMM pool (so CUDA IPC handles stay cached) and no dashboard.

    \b
    Examples:
      spillway bench                                  # W1-W5, O3-O5, B1, B2; small sizes on GPUs
      spillway bench --sizes full --only O3,O4,O5     # a user's rechunk, FFT and halos past the GPUs' memory
      spillway bench --sizes full --out benchmarks/results
      spillway bench --only W1,B2 --runs 5
      spillway bench --sizes full --only B3           # 423 GB over device, host and disk
      spillway bench --cpu --n-workers 2 --sizes tiny # the CI smoke run
      spillway bench --sizes full --only B1 --merge-into benchmarks/results/RUN.json
      spillway bench --sizes full --only W1,W3 --no-baseline --label step1 --transfer-connections 4
      spillway bench --only W1,W2,W5,B2 --timeline    # where each worker's time goes
      spillway bench --link-sweep                     # GB/s against message size, 8 MiB to 2 GiB
      spillway bench --zarr --sizes full              # 100 GB Zarr stores written and read by the GPUs
      spillway bench --matrix 1 --budget 420          # out-of-core matrix, slice 1 (tall-skinny linalg)
      spillway bench --matrix-merge fetched/ --out benchmarks/results
    """
    if matrix_slice is not None or matrix_merge is not None:
        return _matrix(options_flags, out_dir, matrix_slice, matrix_merge, budget, timeout,
                       only=only, merge_into=merge_into, no_baseline=no_baseline, timeline=timeline,
                       link_sweep=link_sweep, zarr=zarr_io, label=label, previous=previous)
    if budget is not None:
        raise ParamError("budget: only used with --matrix")
    if zarr_io:
        return _zarr_bench(resolve(options_flags), out_dir, sizes, runs, timeout, label, no_ceilings,
                           only=only, merge_into=merge_into, no_baseline=no_baseline, timeline=timeline,
                           link_sweep=link_sweep, sweep_sizes=sweep_sizes, previous=previous)
    if link_sweep:
        return _link_sweep(resolve(options_flags), out_dir, sweep_sizes, label, only=only, merge_into=merge_into,
                           no_baseline=no_baseline, no_ceilings=no_ceilings, timeline=timeline, previous=previous)
    if sweep_sizes is not None:
        raise ParamError(f"sweep-sizes: {sweep_sizes!r} is only used with --link-sweep")

    from spillway_bench import prepare, run_bench
    from spillway_bench.ceilings import not_measured
    from spillway_bench.report import failed_workloads, previous_lines, short_table, target_lines

    bench_run = prepare(resolve(options_flags), only=only, sizes=sizes, runs=runs, timeout=timeout,
                        merge_into=merge_into, baseline=not no_baseline, label=label, previous=previous)
    bench_run.timeline = timeline
    bench_run.first_side = first_side
    extra = {"measure_ceilings": not_measured} if no_ceilings else {}
    results, _ = run_bench(bench_run, Path(out_dir), stream=sys.stderr, **extra)
    for line in target_lines(results):
        click.echo(line, err=True)
    click.echo(short_table(results))
    # last, so a row slower than before is the last thing the run says
    for line in previous_lines(results):
        click.echo(line, err=True)
    # a baseline's known failure (B5's) is its result, not a failed bench
    failed = failed_workloads(results)
    if failed:
        click.echo(f"spillway: failed workloads: {', '.join(failed)} (see the log)", err=True)
        sys.exit(1)


def _link_sweep(options, out_dir, sweep_sizes, label, **workload_flags):
    from spillway_bench.link import prepare_sweep, run_sweep, short_table

    given = [f"--{k.replace('_', '-')}" for k, v in workload_flags.items() if v]
    if given:
        raise ParamError(f"link-sweep: measures the link, not the workloads; {', '.join(given)} does not apply")
    link_sweep = prepare_sweep(options, sizes=sweep_sizes, label=label)
    results, _ = run_sweep(link_sweep, Path(out_dir), stream=sys.stderr)
    click.echo(short_table(results))


def _zarr_bench(options, out_dir, sizes, runs, timeout, label, no_ceilings, **workload_flags):
    from spillway_bench.zarr import prepare_zarr, run_zarr_bench, short_table

    given = [f"--{k.replace('_', '-')}" for k, v in workload_flags.items() if v]
    if given:
        raise ParamError(f"zarr: measures Zarr I/O, not the workloads; {', '.join(given)} does not apply")
    zarr_run = prepare_zarr(options, sizes=sizes, runs=runs, timeout=timeout, label=label, no_ceilings=no_ceilings)
    results, _ = run_zarr_bench(zarr_run, Path(out_dir), stream=sys.stderr)
    click.echo(short_table(results))
    if not all(store[name]["bits_equal"] for store in results["stores"].values()
               for name in ("write", "cold_read", "cached_read")):
        click.echo("spillway: a read gave other bits than were written (see the log)", err=True)
        sys.exit(1)


def _matrix(flags, out_dir, selector, merge_dir, budget, timeout, **workload_flags):
    """The out-of-core matrix: one slice on this machine, or slices' files joined."""
    from spillway_bench import matrix
    from spillway_bench.matrix.slices import run_slice, short_table

    given = [f"--{k.replace('_', '-')}" for k, v in workload_flags.items() if v]
    if given:
        raise ParamError(f"matrix: runs the out-of-core cases, not the workloads; {', '.join(given)} does not apply")
    if merge_dir is not None:
        if selector is not None:
            raise ParamError("matrix-merge: joins files; run --matrix SLICE as its own command")
        files = sorted(Path(merge_dir).rglob("*-ooc-matrix.json"))
        if not files:
            raise ParamError(f"matrix-merge: no *-ooc-matrix.json under {merge_dir}")
        paths = matrix.merge_files(files, Path(out_dir))
        for path in paths.values():
            click.echo(f"wrote {path}", err=True)
        return
    options = resolve(flags)
    set_flags = {k: v for k, v in flags.items() if v is not None}
    # the cli cases get the same flags as the local cluster
    cli_args = tuple(a for k, v in set_flags.items()
                     for a in ((f"--{k.replace('_', '-')}" if v else f"--no-{k.replace('_', '-')}",)
                               if isinstance(v, bool) else (f"--{k.replace('_', '-')}", str(v))))
    if options.cpu:
        scale = matrix.cpu_scale(n_workers=options.n_workers or 2)
        kind = "cpu"
    else:
        try:
            scale, kind = matrix.gpu_scale(), "gpu"
        except RuntimeError as e:
            raise ParamError(f"matrix: {e}; --cpu runs the cases on CPU workers at a small stand-in scale") from None

    def local():
        from spillway.clusters.local import Local

        return Local(options)

    try:
        rows, _ = run_slice(selector, Path(out_dir), scale=scale, kind=kind, local=local, cli_args=cli_args,
                            timeout=min(timeout, 580), budget=budget, directory=options.local_directory,
                            log=lambda m: click.echo(m, err=True))
    except ValueError as e:
        raise ParamError(str(e)) from None
    click.echo(short_table(rows))
    bad = [r["case"] for r in rows if not (r["ok"] or r["refused"])]
    if bad:
        click.echo(f"spillway: matrix cases without NumPy's answer: {', '.join(bad)}", err=True)
        sys.exit(1)
