"""One study run on this machine's workers: the study's workloads at the sizes for its
worker count, part by part, each part written into the first part's results file as soon
as it ends."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spillway.options.errors import ParamError

from ..formatting import fmt_shape
from ..workloads import WORKLOADS
from .combined import machine_kind
from .sizes import BASE_WORKERS, LEFT_OUT, MODES, PARTS, modes_at, scaled, study

def file_label(mode: str, n_workers: int) -> str:
    return f"{mode}-n{n_workers}"


def run_study(options, *, mode: str, sizes: str = "auto", only: str | None = None, runs: int = 3,
              timeout: float = 120, out_dir: Path, budget_s: float = 540, stream=sys.stderr,
              measure_ceilings: Callable | None = None, inventory=None, timeline: bool = False,
              clock: Callable[[], float] = time.monotonic) -> tuple[dict, dict[str, Path]]:
    """Run the study's workloads at the sizes for this machine's worker count; returns the
    results and the files written (``<machine>-<date>-<mode>-n<N>.{json,md,png,log}``, and
    with ``timeline`` the recorded runs' ``-timeline.png`` and ``.html`` beside them).

    Every request is checked, scaled sizes included, before any cluster starts."""
    from ..suite import budget, prepare, run_bench
    from ..harness import check_fits

    started = clock()
    if mode not in MODES:
        raise ParamError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    names = study(only)
    first = prepare(options, only=",".join(names), sizes=sizes, runs=runs, timeout=timeout, inventory=inventory)
    n = first.launch.n_workers
    label = file_label(mode, n)
    # spillway's side alone: the baseline is not what scales here
    extra: dict[str, Any] = {"baseline": False, "label": label}
    all_scaled = [scaled(WORKLOADS[name], first.scale, mode, n) for name in names]
    check_fits(all_scaled, first.scale, first.launch.kind, budget(first.launch))
    by_name = {w.name: w for w in all_scaled}
    ceilings_kw = {} if measure_ceilings is None else {"measure_ceilings": measure_ceilings}

    parts = [[name for name in part if name in by_name] for part in PARTS]
    parts = [p for p in parts if p]
    json_path: Path | None = None
    paths: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    scaling = {
        "mode": mode,
        "modes": modes_at(n, mode),
        "workers": n,
        "base_workers": BASE_WORKERS,
        "kind": None,
        "sizes": first.scale,
        "shapes": {w.name: list(w.params(first.scale)["shape"]) for w in all_scaled},
        "data_bytes_per_worker": {w.name: w.input_bytes(first.scale) / n for w in all_scaled},
        "skipped": skipped,
        #: each part that ran: its workloads and seconds (clusters and ceilings included)
        "parts": [],
        "left_out": dict(LEFT_OUT),
        "wall_s": None,
    }
    for part in parts:
        elapsed = clock() - started
        if json_path is not None and elapsed > budget_s:
            for name in part:
                skipped[name] = f"not started: {elapsed:.0f} s into the run, past its budget of {budget_s:.0f} s"
                if stream is not None:
                    print(f"{name} {skipped[name]}", file=stream, flush=True)
            continue
        part_start = clock()
        bench_run = prepare(options, only=",".join(part), sizes=first.scale, runs=runs, timeout=timeout,
                       inventory=first.inventory, merge_into=json_path, **extra)
        bench_run = dataclasses.replace(bench_run, workloads=[by_name[name] for name in part], timeline=timeline)
        _, written = run_bench(bench_run, Path(out_dir), stream=stream, **ceilings_kw)
        if json_path is None:
            paths = dict(written)
            json_path = paths["json"]
        else:
            # the later parts' timelines are drawn into the first part's files
            paths.update((k, v) for k, v in written.items() if k.startswith("timeline"))
            _append_log(paths["log"], written["log"])
            if stream is not None:
                print(f"its log is appended to {paths['log']}", file=stream, flush=True)
        scaling["parts"].append({"workloads": part, "seconds": clock() - part_start})
        # after every part, so a command stopped at a time limit leaves a file the report reads
        _record(json_path, scaling, wall_s=clock() - started)
    results = _record(json_path, scaling, wall_s=clock() - started)
    with paths["md"].open("a") as md:
        md.write(f"\n## Scaling\n\n{mode} scaling run on {n} workers ({', '.join(scaling['modes'])} "
                 f"at this count); shapes: "
                 + "; ".join(f"{k} {fmt_shape(v)}" for k, v in scaling["shapes"].items())
                 + "".join(f"\n- {k}: {v}" for k, v in skipped.items()) + "\n")
    return results, paths


def _record(json_path: Path, scaling: dict, *, wall_s: float) -> dict:
    """The results file with the study's ``scaling`` section written into it."""
    results = json.loads(json_path.read_text())
    results["scaling"] = dict(scaling, kind=machine_kind(results["machine"]), wall_s=wall_s)
    json_path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return results


def _append_log(into: Path, part: Path) -> None:
    """One log per study run: a later part's log goes onto the first part's."""
    if part == into or not part.exists():
        return
    with into.open("a") as out:
        out.write(part.read_text())
    part.unlink()
