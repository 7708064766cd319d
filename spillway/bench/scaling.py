"""The scaling study: how ``spillway bench``'s times and worker-to-worker bandwidth change
from 2 to 4 to 8 workers of one host.

Two modes. **Strong** scaling keeps each workload's size at the chosen scale, whatever
the worker count. **Weak** scaling keeps the data per worker that the workload has on
:data:`BASE_WORKERS` workers: the array grows with the worker count along the axes
:data:`GROWTH` names, in whole steps of its chunk shape, so chunk shapes stay the
workload's and the number of chunks per worker stays (within one row of chunks) the
same. At :data:`BASE_WORKERS` workers both modes run the same sizes, so one run there
serves both.

The harness runs a workload at a scaled size without knowing of it: :func:`scaled`
returns a copy of the workload whose only size, under the scale the harness is asked
for, is the scaled one, and :func:`run_study` puts those copies into the plan
:func:`~spillway.bench.prepare` made.

One study run is cut into parts (:data:`PARTS`), each written into the first part's
results file as soon as it ends, so a command stopped at a time limit keeps what it
finished; no part starts once ``budget_s`` has passed. :func:`combine` reads the runs of
several worker counts back and tabulates them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spillway.service.errors import ParamError
from . import render, report
from .workloads import WORKLOADS, Workload, data_bytes

#: the worker count whose sizes the weak mode keeps per worker (the issue's 2 x H200 host)
BASE_WORKERS = 2

MODES = ("weak", "strong")

#: how each workload of the study grows in weak mode: "square" grows both axes alike
#: (x + x.T and x.dot(y) need square operands), a tuple the axes that grow
GROWTH: dict[str, str | tuple[int, ...]] = {
    "W1": "square",
    "W2": "square",
    # rows in, columns out: the leading axis grows in whole column chunks, so each output
    # chunk gathers from as many input chunks as on two workers
    "W3": (0,),
    # the transformed axis 0 must stay one chunk: the panels multiply along axis 1
    "W4": (1,),
    "W5": (0,),
    "B2": "square",
}

#: workloads of ``spillway bench`` the study leaves out, and why
LEFT_OUT = {
    "B1": ("sized to exceed the memory two H200s give a worker by default (204.8 GB): with strong "
           "scaling 4 or 8 GPUs hold it outright, so it stops measuring what it is for, and with weak "
           "scaling it is W1 at 102 GB per GPU, 819 GB of inputs to persist per run on 8 GPUs"),
    "B3": ("sized to 1.5 times two H200s, with tier limits per worker: with weak scaling 8 GPUs need "
           "1.7 TB over device, pinned host and disk, more disk than the 8-GPU host has; with strong "
           "scaling its 423 GB fit on 4 GPUs' devices and the tiers go unused"),
}

#: the workloads of one study run, in the order they run; each part is one cluster
#: (B2's device limit needs its own anyway) and is written before the next starts.
#: W3 goes last: its thousands of slicing tasks make it the hardest to predict.
PARTS = (("W1", "W2", "W4", "W5"), ("B2",), ("W3",))
STUDY = tuple(name for part in PARTS for name in part)


# --- sizes (pure functions)


def _nearest_square(target: float) -> int:
    """The k >= 1 whose k^2 is nearest ``target``; ties go to the larger k."""
    low = max(1, math.isqrt(math.floor(target)))
    return min((low, low + 1), key=lambda k: (abs(k * k - target), -k))


def growth_step(params: Mapping[str, Any], axis: int) -> int:
    """The smallest length by which ``axis`` can grow keeping every chunk shape of the
    workload (input chunks, and the chunks it rechunks to or produces) whole."""
    step = 1
    for key in ("chunks", "to_chunks", "out_chunks"):
        chunks = params.get(key)
        if chunks:
            step = math.lcm(step, int(chunks[axis]))
    return step


def _check_divisible(name: str, params: Mapping[str, Any]) -> None:
    shape = params["shape"]
    for key in ("chunks", "to_chunks", "out_chunks"):
        chunks = params.get(key)
        if chunks and any(s % c for s, c in zip(shape, chunks)):
            raise ParamError(f"{name}: shape {tuple(shape)} is not a whole number of {key} {tuple(chunks)}")


def weak_params(workload: Workload, scale: str, n_workers: int) -> dict:
    """The workload's parameters at ``scale`` with the data per worker it has on
    :data:`BASE_WORKERS` workers, for ``n_workers`` workers."""
    if n_workers < 1:
        raise ParamError(f"n-workers: {n_workers} must be >= 1")
    base = dict(workload.params(scale))
    growth = GROWTH.get(workload.name)
    if growth is None:
        raise ParamError(f"only: {workload.name} is not part of the scaling study")
    _check_divisible(workload.name, base)
    shape = list(base["shape"])
    factor = n_workers / BASE_WORKERS
    if growth == "square":
        step = growth_step(base, 0)
        if shape[0] != shape[1] or growth_step(base, 1) != step:
            raise ParamError(f"{workload.name}: square growth needs a square shape and chunks, got {tuple(shape)}")
        k = _nearest_square((shape[0] // step) ** 2 * factor)
        shape[0] = shape[1] = k * step
    else:
        (axis,) = growth
        step = growth_step(base, axis)
        target = shape[axis] / step * factor
        units = max(1, min((math.floor(target), math.ceil(target)), key=lambda u: (abs(u - target), -u)))
        shape[axis] = units * step
    out = dict(base, shape=tuple(shape))
    if tuple(base.get("out_shape", ())) == tuple(base["shape"]):
        out["out_shape"] = tuple(shape)
    return out


def strong_params(workload: Workload, scale: str, n_workers: int) -> dict:
    """Strong scaling: the workload's size at ``scale``, whatever the worker count."""
    if n_workers < 1:
        raise ParamError(f"n-workers: {n_workers} must be >= 1")
    return dict(workload.params(scale))


def scaled_params(workload: Workload, scale: str, mode: str, n_workers: int) -> dict:
    if mode not in MODES:
        raise ParamError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    return (weak_params if mode == "weak" else strong_params)(workload, scale, n_workers)


def scaled(workload: Workload, scale: str, mode: str, n_workers: int) -> Workload:
    """A copy of ``workload`` whose size under ``scale`` is the scaled one (its other
    scales are dropped, so nothing can run it at a size the study did not choose)."""
    return dataclasses.replace(workload, sizes={scale: scaled_params(workload, scale, mode, n_workers)})


def row_bytes(workload: Workload, params: Mapping[str, Any]) -> int:
    """Bytes of one growth step of the inputs: one row of chunks (square growth) or one
    step of the growing axis across the rest of the array."""
    growth = GROWTH[workload.name]
    axis = 0 if growth == "square" else growth[0]
    shape = list(params["shape"])
    shape[axis] = growth_step(params, axis)
    return data_bytes(dict(params, shape=tuple(shape)))


def modes_at(n_workers: int, mode: str) -> list[str]:
    """The modes one run at ``n_workers`` serves: both at the base count (same sizes)."""
    return list(MODES) if n_workers == BASE_WORKERS else [mode]


def study(only: str | None) -> list[str]:
    """The study's workloads named in ``only`` ("W1,B2"), in run order; all by default."""
    if not only:
        return list(STUDY)
    names = [n.strip().upper() for n in only.split(",") if n.strip()]
    for n in names:
        if n in LEFT_OUT:
            raise ParamError(f"only: {n} is not part of the scaling study: {LEFT_OUT[n]}")
        if n not in STUDY:
            raise ParamError(f"only: {n!r} is not a workload of the scaling study (known: {', '.join(STUDY)})")
    return [n for n in STUDY if n in names]


# --- one study run on this machine's workers


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
    from . import _budget, prepare, run_bench
    from .harness import check_fits

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
    check_fits(all_scaled, first.scale, first.launch.kind, _budget(first.launch, first.inventory))
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
        plan = prepare(options, only=",".join(part), sizes=first.scale, runs=runs, timeout=timeout,
                       inventory=first.inventory, merge_into=json_path, **extra)
        plan = dataclasses.replace(plan, workloads=[by_name[name] for name in part], timeline=timeline)
        _, written = run_bench(plan, Path(out_dir), stream=stream, **ceilings_kw)
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
                 + "; ".join(f"{k} {'x'.join(map(str, v))}" for k, v in scaling["shapes"].items())
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


# --- combining the runs of several worker counts (no GPU needed)


def machine_kind(machine: Mapping[str, Any]) -> str:
    """What runs must share to be compared: the worker kind and the GPU model (the host's
    GPU count differs between the 2-, 4- and 8-GPU hosts)."""
    gpus = machine.get("gpus") or []
    if machine.get("workers") == "gpu" and gpus:
        return f"gpu {gpus[0]['name']}"
    return "cpu"


def load_runs(files: Sequence[str | Path]) -> tuple[str, list[dict]]:
    """The study runs in ``files``, fewest workers first, and their common mode; refuses
    files that are not study runs or mix modes, sizes, machine kinds or worker counts."""
    if not files:
        raise ParamError("files: give the JSON files of the study's runs (one per worker count)")
    runs = []
    for f in files:
        path = Path(f)
        try:
            data = json.loads(path.read_text())
            data["scaling"]["workers"], data["scaling"]["modes"], data["workloads"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ParamError(f"file: {str(path)!r} is not a bench-scaling results file ({type(e).__name__}: {e})") from None
        data["_path"] = str(path)
        runs.append(data)
    first = runs[0]
    modes = set(MODES)
    for r in runs:
        modes &= set(r["scaling"]["modes"])
        if not modes:
            raise ParamError(f"mode: {r['_path']} is a {r['scaling']['mode']} run, {first['_path']} is "
                             f"{first['scaling']['mode']}; combine runs of one mode")
        for key, what in (("sizes", "sizes"), ("kind", "machine kind")):
            if r["scaling"][key] != first["scaling"][key]:
                raise ParamError(f"{what}: {r['_path']} has {r['scaling'][key]!r}, {first['_path']} has "
                                 f"{first['scaling'][key]!r}; combine runs of one {what}")
    counts = [r["scaling"]["workers"] for r in runs]
    for c in set(counts):
        if counts.count(c) > 1:
            raise ParamError(f"files: {counts.count(c)} runs on {c} workers; give one run per worker count")
    # a run at the base count serves both modes: the others' mode names the study
    mode = first["scaling"]["mode"] if first["scaling"]["mode"] in modes else next(iter(modes))
    return mode, sorted(runs, key=lambda r: r["scaling"]["workers"])


def efficiency(mode: str, t_ref: float | None, n_ref: int, t: float | None, n: int) -> float | None:
    """Parallel efficiency against the run with the fewest workers: weak t_ref / t,
    strong (t_ref * n_ref) / (t * n)."""
    if not t_ref or not t:
        return None
    return t_ref / t if mode == "weak" else (t_ref * n_ref) / (t * n)


def combine(mode: str, runs: list[dict]) -> dict:
    """Per workload, one row per worker count (fewest first)."""
    names = [n for n in STUDY if any(w["name"] == n for r in runs for w in r["workloads"])]
    table = {}
    for name in names:
        rows = []
        for r in runs:
            w = next((w for w in r["workloads"] if w["name"] == name), None)
            if w is None:
                continue
            n = r["scaling"]["workers"]
            shape = r["scaling"].get("shapes", {}).get(name)
            rows.append({
                "workers": n, "shape": shape, "time_s": w.get("spillway_s"),
                "error": (w.get("spillway") or {}).get("error"),
                "transfer_gbps_p25": w.get("transfer_gbps_p25"),
                "transfer_gbps_median": w.get("transfer_gbps_median"),
                "transfer_gbps_p75": w.get("transfer_gbps_p75"),
                "bytes_moved": w.get("bytes_moved"),
                "data_bytes_per_worker": r["scaling"].get("data_bytes_per_worker", {}).get(name),
                "file": r["_path"],
            })
        ref = rows[0]
        for row in rows:
            row["relative_time"] = (row["time_s"] / ref["time_s"]) if row["time_s"] and ref["time_s"] else None
            row["efficiency"] = efficiency(mode, ref["time_s"], ref["workers"], row["time_s"], row["workers"])
        table[name] = rows
    first = runs[0]
    return {"mode": mode, "sizes": first["scaling"]["sizes"], "kind": first["scaling"]["kind"],
            "workers": [r["scaling"]["workers"] for r in runs], "base_workers": BASE_WORKERS,
            "files": [r["_path"] for r in runs], "workloads": table}


def _fmt(v, fmt="{:.3f}"):
    return "—" if v is None else fmt.format(v)


def _shape(s):
    return "—" if not s else "x".join(map(str, s))


HEADER = ("workers", "shape", "time s", "rel. time", "efficiency", "xfer GB/s median", "p25 / p75", "moved")


def _cells(row) -> tuple[str, ...]:
    time_s = f"failed: {row['error']}" if row["error"] else _fmt(row["time_s"])
    return (str(row["workers"]), _shape(row["shape"]), time_s, _fmt(row["relative_time"], "{:.2f}x"),
            _fmt(row["efficiency"], "{:.2f}"), _fmt(row["transfer_gbps_median"], "{:.1f}"),
            f"{_fmt(row['transfer_gbps_p25'], '{:.1f}')} / {_fmt(row['transfer_gbps_p75'], '{:.1f}')}",
            render.fmt_bytes(row["bytes_moved"]))


def text_table(combined: dict) -> str:
    """The tables printed on the terminal, one per workload."""
    out = []
    for name, rows in combined["workloads"].items():
        cells = [HEADER] + [_cells(r) for r in rows]
        widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
        out.append(f"{name} ({combined['mode']} scaling)")
        out += ["  ".join(c[i].rjust(widths[i]) for i in range(len(HEADER))) for c in cells]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


EFFICIENCY = {"weak": "t(n0) / t(n), data per worker fixed", "strong": "t(n0) * n0 / (t(n) * n), total data fixed"}


def markdown(combined: dict) -> str:
    lines = [f"# spillway bench-scaling: {combined['mode']} scaling, {combined['sizes']} sizes, {combined['kind']}",
             "", f"- workers: {', '.join(map(str, combined['workers']))}; efficiency is "
             f"{EFFICIENCY[combined['mode']]}, n0 the fewest workers here",
             "- time: spillway's side, median of the timed runs; transfers: per-transfer GB/s of 1 MB or more",
             "- runs: " + ", ".join(f"`{f}`" for f in combined["files"]),
             "- left out: " + "; ".join(f"{k}: {v}" for k, v in LEFT_OUT.items())]
    for name, rows in combined["workloads"].items():
        lines += ["", f"## {name}", "", "| " + " | ".join(HEADER) + " |",
                  "| " + " | ".join(["---:"] * len(HEADER)) + " |"]
        lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot(combined: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_e, ax_b) = plt.subplots(1, 3, figsize=(15, 4.5))
    for name, rows in combined["workloads"].items():
        timed = [r for r in rows if r["time_s"]]
        if timed:
            ax_t.plot([r["workers"] for r in timed], [r["time_s"] for r in timed], marker="o", label=name)
            ax_e.plot([r["workers"] for r in timed], [r["efficiency"] for r in timed], marker="o", label=name)
        moved = [r for r in rows if r["transfer_gbps_median"]]
        if moved:
            med = np.array([r["transfer_gbps_median"] for r in moved])
            lo = np.array([r["transfer_gbps_p25"] or m for r, m in zip(moved, med)])
            hi = np.array([r["transfer_gbps_p75"] or m for r, m in zip(moved, med)])
            ax_b.errorbar([r["workers"] for r in moved], med, capsize=3, marker="o", label=name,
                          yerr=np.vstack([np.maximum(med - lo, 0), np.maximum(hi - med, 0)]))
    ticks = combined["workers"]
    for ax, ylabel, title in ((ax_t, "wall time, median (s)", "time"),
                              (ax_e, "parallel efficiency", f"efficiency ({combined['mode']})"),
                              (ax_b, "worker-to-worker GB/s (p25, median, p75)", "transfer bandwidth")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("workers")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    ax_e.axhline(1.0, color="black", linestyle="--", linewidth=1)
    if ax_t.lines:  # strong scaling can span an order of magnitude
        ax_t.set_yscale("log")
    fig.suptitle(f"spillway bench-scaling: {combined['mode']} scaling, {combined['sizes']} sizes, {combined['kind']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_stem(combined: dict) -> str:
    kind = "".join(c if c.isalnum() else "-" for c in combined["kind"].lower()).strip("-")
    # not "-<mode>-n<N>": a glob over the runs' files must not pick the report up
    return f"scaling-{kind}-{combined['sizes']}-{combined['mode']}-workers-{'-'.join(map(str, combined['workers']))}"


def write_report(combined: dict, out_dir: Path) -> dict[str, Path]:
    return report.write(combined, out_dir, report_stem(combined), render=markdown, draw=plot)
