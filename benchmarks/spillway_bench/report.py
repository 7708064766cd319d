"""The bench's results as JSON with the machine, written with their markdown and PNG
(:mod:`.render`) to ``<out>/<machine>-<date>[-<label>].{json,md,png,log}``: per workload
each side's details, the speedup, transfers against ``peer_copy``, spill throughput
against the pinned copies, the bounds (:mod:`.bounds`), the targets, and for O3-O5 each
side's first run and median against its bounds; ``previous``, ``slower`` and ``new``
against the machine's previous result (:mod:`.previous`).
"""

from __future__ import annotations

import json
import os
import platform
import re
from datetime import datetime, timezone
from pathlib import Path

from spillway.options.errors import ParamError
from . import timeline
from .render import SIDES, SPILL_CEILINGS, markdown, plot, short_table, spills, target_lines  # noqa: F401
from .previous import lines as previous_lines  # noqa: F401


def describe_machine(inventory, kind: str) -> dict:
    import psutil

    from spillway.options.stack import installed_stack

    # the topology as `spillway info` reads it, so both agree with `nvidia-smi topo -m`
    gpus = [
        {"index": g.index, "name": g.name, "memory_total": g.memory_total, **g.links_json()}
        for g in (inventory.gpus if inventory is not None else ())
    ]
    if kind == "gpu" and gpus:
        slug = f"{len(gpus)}x-{gpus[0]['name']}"
    else:
        slug = f"cpu-{os.cpu_count()}c"
    return {
        "name": re.sub(r"[^a-z0-9]+", "-", slug.lower()).strip("-"),
        "workers": kind,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_total": psutil.virtual_memory().total,
        "gpus": gpus,
        "driver_version": getattr(inventory, "driver_version", None),
        "cuda_driver_version": getattr(inventory, "cuda_driver_version", None),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "stack": installed_stack(),
    }


def cpu_model() -> str:
    """The host CPU's model name, as /proc/cpuinfo gives it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


#: what a label may hold: it becomes part of file names
LABEL = re.compile(r"[A-Za-z0-9_.-]{1,40}")


def check_label(label: str | None) -> str | None:
    if label is not None and not LABEL.fullmatch(label):
        raise ParamError(f"label: {label!r} must be 1 to 40 letters, digits, '_', '.' or '-'")
    return label


def stem(machine: dict | str, when: datetime | None = None, label: str | None = None, *, day: bool = False) -> str:
    """``<machine>-<date>``, then ``-<label>`` where the run has one; the date is the
    UTC time to the second, or the day alone with ``day`` (files that several runs of
    one day add to, as the out-of-core matrix's)."""
    when = when or datetime.now(timezone.utc)
    name = machine if isinstance(machine, str) else machine["name"]
    date = f"{when:%Y-%m-%d}" if day else f"{when:%Y-%m-%dT%H%M%SZ}"
    return f"{name}-{date}" + (f"-{label}" if label else "")


def _ratio(a, b):
    return a / b if a is not None and b else None


#: and the disk moves' (the store writes through the page cache, so host -> disk may pass
#: the fsync'd disk_write ceiling while the cache has room)
DISK_CEILINGS = {"host_to_disk": "disk_write", "disk_to_host": "disk_read"}

BASELINE_SPILL = "not measured: dask-cuda's spilling is not timed (bytes are counted)"


def spill_throughput(moves: dict | None, ceilings) -> dict | None:
    """Each move's bytes, seconds and GB/s per worker with its ceiling and the ratio."""
    if not moves:
        return None
    out = {}
    for move, m in moves.items():
        name = SPILL_CEILINGS.get(move) or DISK_CEILINGS.get(move)
        ceiling = ceilings.gbps.get(name) if name else None
        out[move] = {**m, "ceiling": name, "ceiling_gbps": ceiling,
                     "ratio_to_ceiling": _ratio(m.get("gbps_per_worker"), ceiling)}
    return out


def spill_ratio(throughput: dict | None) -> float | None:
    """The lower ratio to the pinned ceiling of the device <-> host moves that happened."""
    if not throughput:
        return None
    ratios = [throughput[m]["ratio_to_ceiling"] for m in SPILL_CEILINGS
              if m in throughput and throughput[m]["bytes"] > 0]
    return min(ratios) if ratios and None not in ratios else None


def bound_of(side: dict, ceilings, n_workers: int) -> dict | None:
    """One side's copy bound (:func:`.bounds.copy_bound`) next to its median time, where it moved
    bytes between device, host and disk; None where nothing moved or nothing was counted."""
    from . import bounds

    moves = bounds.move_bytes(side.get("spill_moves"))
    if not any(moves.values()):
        return None
    return bounds.with_time(bounds.copy_bound(moves, ceilings.gbps, n_workers), side.get("median_s"))


def workload_bound(workload, scale: str, side: dict, spill_bound_s, ceilings, n_workers: int) -> dict | None:
    """spillway's time against its compute and copy bounds (:mod:`.bounds`), where the
    workload declares its work."""
    from . import bounds

    work = getattr(workload, "work", None)
    if work is None or not side:
        return None
    return bounds.bound(work(workload.params(scale)), side.get("bytes_moved"), spill_bound_s, ceilings.gbps,
                        n_workers, side.get("median_s"))


def workload_entry(workload, scale: str, sides: dict, ceilings, n_workers: int = 1, links: int | None = None) -> dict:
    """The JSON object of one workload; ``links``: the GPUs whose host links and links in
    the workers share (the workers where None)."""
    detail = {side: sides[side].to_json() for side in SIDES if side in sides}
    sp, base = detail.get("spillway", {}), detail.get("baseline", {})
    peer = ceilings.peer_copy
    entry = {
        "name": workload.name,
        "description": workload.describe(scale),
        "input_bytes": workload.input_bytes(scale),
        "chunk_bytes": workload.chunk_bytes(scale),
        "spillway_s": sp.get("median_s"),
        "baseline_s": base.get("median_s"),
        "speedup": _ratio(base.get("median_s"), sp.get("median_s")),
        "transfer_gbps_p25": sp.get("transfer_gbps_p25"),
        "transfer_gbps_median": sp.get("transfer_gbps_median"),
        "transfer_gbps_p75": sp.get("transfer_gbps_p75"),
        "transfer_gbps_median_256mib": sp.get("transfer_gbps_median_256mib"),
        "peer_copy_gbps": peer,
        "transfer_ratio_to_peer_copy": _ratio(sp.get("transfer_gbps_median"), peer),
        "transfer_256mib_ratio_to_peer_copy": _ratio(sp.get("transfer_gbps_median_256mib"), peer),
        "baseline_transfer_gbps_median": base.get("transfer_gbps_median"),
        "baseline_transfer_ratio_to_peer_copy": _ratio(base.get("transfer_gbps_median"), peer),
        "bytes_moved": sp.get("bytes_moved"),
        "baseline_bytes_moved": base.get("bytes_moved"),
        "bytes_spilled": sp.get("bytes_spilled"),
        "baseline_bytes_spilled": base.get("bytes_spilled"),
        "persist_s": sp.get("persist_s"),
        "resident_after_persist": sp.get("resident_after_persist"),
        "verify": sp.get("verify"),
        "baseline_verify": base.get("verify"),
        "baseline_skipped": base.get("skipped"),
        "baseline_error": base.get("error"),
        "baseline_expected_failure": base.get("expected_failure"),
        "speedup_target": speedup_target(workload),
    }
    throughput = spill_throughput(sp.get("spill_moves"), ceilings) if sp.get("spill_timed") else None
    entry["spill_throughput"] = throughput
    # moves while the inputs were persisted (before the clock): B3 fills its tiers here
    entry["persist_spill_throughput"] = (spill_throughput(sp.get("persist_spill_moves"), ceilings)
                                         if sp.get("spill_timed") else None)
    entry["spill_ratio_to_pinned"] = spill_ratio(throughput)
    entry["restore_wait_s"] = sp.get("restore_wait_s")
    entry["baseline_spill_throughput"] = BASELINE_SPILL if base and not base.get("skipped") else None
    entry["sized_from_gpu_bytes"] = getattr(workload, "sized_from", None)
    entry["copy_bound"] = bound_of(sp, ceilings, n_workers) if sp else None
    entry["copy_bound_s"] = (entry["copy_bound"] or {}).get("bound_s")
    entry["time_over_copy_bound"] = (entry["copy_bound"] or {}).get("ratio")
    entry["baseline_copy_bound"] = bound_of(base, ceilings, n_workers) if base and not base.get("skipped") else None
    entry["bound"] = workload_bound(workload, scale, sp, entry["copy_bound_s"], ceilings, n_workers)
    if getattr(workload, "fresh_cluster", False):
        entry.update(out_of_core_entry(workload, scale, detail, ceilings, links or n_workers))
    entry.update(detail)
    return entry


def out_of_core_entry(workload, scale: str, detail: dict, ceilings, links: int) -> dict:
    """An out-of-core row's own fields (O3, O4): each side's details get their tiers'
    bounds (:func:`.bounds.side_bounds`), and ``out_of_core`` sums them up per side
    with spillway over ``tasks_method``, first runs and medians."""
    from . import bounds

    per_side = {}
    for side in workload.sides:
        d = detail.get(side)
        if d is None:
            continue
        d.update(bounds.side_bounds(d, ceilings.gbps, links))
        per_side[side] = {k: d.get(k) for k in ("first_s", "median_s", "bound_s", "first_bound_s", "time_over_bound",
                                                "first_over_bound", "forced_bound_s", "first_forced_bound_s",
                                                "time_over_forced", "first_over_forced", "rechunk_method", "error",
                                                "expected_failure", "skipped")}
        per_side[side]["moved_over_forced"] = (d.get("forced_bound") or {}).get("moved_over_forced")
    sp, tm = per_side.get("spillway", {}), per_side.get("tasks_method", {})
    footprint = workload.footprint_bytes(scale)
    sized = getattr(workload, "sized_from", None) if scale == "full" else None
    return {
        "tasks_method_s": tm.get("median_s"),
        "out_of_core": {
            "footprint_bytes": footprint,
            "footprint_over_gpus": footprint / sized if sized else None,
            "gpus": getattr(workload, "sized_for_gpus", None) if sized else None,
            "links": links,
            "sides": per_side,
            "spillway_over_tasks_method": _ratio(sp.get("median_s"), tm.get("median_s")),
            "first_spillway_over_tasks_method": _ratio(sp.get("first_s"), tm.get("first_s")),
        },
    }


#: the issue's targets: transfers of 256 MiB or more at this share of the peer copy, and
#: this speedup over the baseline for the W workloads
TRANSFER_TARGET = 0.8
SPEEDUP_TARGET = 2.0
#: spilling and restoring at this share of the pinned copy ceiling, where a workload spills
SPILL_TARGET = 0.7


def speedup_target(workload) -> float | None:
    """The speedup over the baseline a workload is held to: its own (B2 5x, B4 1.5x), or
    the W workloads' 2x."""
    own = getattr(workload, "speedup_target", None)
    if own is not None:
        return own
    return SPEEDUP_TARGET if workload.name.startswith("W") else None


def targets(workloads: list[dict], kind: str) -> list[dict]:
    """Each target per workload: met (true/false), or null where it cannot be judged
    (the targets are the GPU host's; CPU runs are smoke runs)."""
    out = []
    for w in workloads:
        ratio = w["transfer_256mib_ratio_to_peer_copy"]
        out.append({"name": w["name"], "target": "transfers >= 256 MiB at >= 80% of peer copy",
                    "value": ratio, "met": None if ratio is None or kind != "gpu" else ratio >= TRANSFER_TARGET})
        goal = w.get("speedup_target", SPEEDUP_TARGET if w["name"].startswith("W") else None)
        if goal is not None:
            out.append({"name": w["name"], "target": f"at least {goal:g}x faster than the baseline",
                        "value": w["speedup"],
                        "met": None if w["speedup"] is None or kind != "gpu" else w["speedup"] >= goal})
        if w.get("baseline_expected_failure") or w["name"] == "B5":
            # judged on every machine: completing with NumPy's answer is not a GPU figure
            sp = w.get("spillway") or {}
            v = w.get("verify")
            ran = sp.get("error") is None and bool(sp.get("runs_s"))
            out.append({"name": w["name"], "target": "spillway completes with NumPy's answer where the "
                                                     "baseline fails",
                        "value": v["rel_error"] if v else None,
                        "met": ran and bool(v and v["ok"]),
                        "baseline": ("failed: " + w["baseline_error"]) if w.get("baseline_error")
                        else "skipped" if w.get("baseline_skipped") else "completed"})
        if spills(w):
            ratio = w.get("spill_ratio_to_pinned")
            out.append({"name": w["name"], "target": "spill throughput >= 70% of the pinned ceiling",
                        "value": ratio,
                        "met": None if ratio is None or kind != "gpu" else ratio >= SPILL_TARGET})
    return out


def links_of(launch) -> int:
    """The GPUs of a run (each with its host link and link in), or its workers on CPU."""
    gpus = len(getattr(launch, "gpus", ()) or ()) if launch.kind == "gpu" else 0
    return gpus or max(1, launch.n_workers)


def build_results(*, machine, ceilings, bench_run, outcome, started, finished) -> dict:
    entries = [workload_entry(w, bench_run.scale, outcome["results"][w.name], ceilings, bench_run.launch.n_workers,
                              links=links_of(bench_run.launch))
               for w in bench_run.workloads]
    return {
        "machine": machine,
        "label": bench_run.label,
        "baseline_run": bench_run.baseline,
        "ceilings": dict(ceilings.gbps),
        "ceilings_skipped": dict(ceilings.skipped),
        "ceiling_bytes": ceilings.nbytes,
        "sizes": bench_run.scale,
        "runs": bench_run.runs,
        "started": started,
        "finished": finished,
        "clusters": outcome["clusters"],
        "workloads": entries,
        "targets": targets(entries, bench_run.launch.kind),
    }


def merge(earlier: dict, later: dict, *, kind: str, order: list[str]) -> dict:
    """``earlier`` with ``later``'s workloads added (replacing those of the same name),
    in catalogue order; each run that contributed is listed under ``parts``."""
    merged = dict(earlier)
    by_name = {w["name"]: w for w in earlier["workloads"]}
    by_name.update({w["name"]: w for w in later["workloads"]})
    merged["workloads"] = sorted(by_name.values(), key=lambda w: order.index(w["name"]))
    merged["targets"] = targets(merged["workloads"], kind)
    merged["finished"] = later["finished"]
    parts = list(earlier.get("parts") or [{"started": earlier["started"], "finished": earlier["finished"],
                                           "workloads": [w["name"] for w in earlier["workloads"]]}])
    parts.append({"started": later["started"], "finished": later["finished"],
                  "workloads": [w["name"] for w in later["workloads"]]})
    merged["parts"] = parts
    clusters = dict(earlier.get("clusters", {}))
    for side, described in later.get("clusters", {}).items():
        clusters.setdefault(side, described)
    merged["clusters"] = clusters
    return merged


def failed_workloads(results: dict) -> list[str]:
    """Workloads with a side that failed, leaving out a baseline's expected failure (B5)."""
    failed = []
    for w in results["workloads"]:
        sides = [s for s in SIDES if (w.get(s) or {}).get("error")
                 and not (s == "baseline" and (w.get(s) or {}).get("expected_failure"))]
        if sides:
            failed.append(w["name"])
    return failed


def write(results: dict, out_dir: Path, name: str, *, render=None, draw=None) -> dict[str, Path]:
    """``<name>.json``, ``.md`` and ``.png`` in ``out_dir``: the results, ``render(results)``
    and ``draw(results, path)`` (the bench's own markdown and plot unless given); and the
    recorded runs' ``<name>-timeline.png`` where there are any."""
    out_dir.mkdir(parents=True, exist_ok=True)
    timelines = timeline.write_files(results, out_dir, name)
    paths = {ext: out_dir / f"{name}.{ext}" for ext in ("json", "md", "png")}
    paths["json"].write_text(json.dumps(results, indent=2, default=str) + "\n")
    paths["md"].write_text((render or markdown)(results))
    (draw or plot)(results, paths["png"])
    return {**paths, **timelines}
