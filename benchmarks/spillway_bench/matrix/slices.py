"""Named slices of the matrix, each sized to one device call, and the command that runs one.

A device call on the GPU host lasts at most 10 minutes, so the 35 cases run in slices
(:data:`SLICES`), the most informative first: the tall-skinny linear algebra on persisted
data that failed before. :func:`estimate` predicts a case's seconds from the bytes it
moves and the flops it does at a scale; ``tests/bench/test_ooc_matrix.py``
holds every slice under :data:`SLICE_BUDGET_S` at one H100 80 GB.

:func:`run_slice` measures the copy ceilings (before any cluster), runs the slice's cli
cases (a process each), then its notebook and user-code cases on one
:func:`spillway.local` cluster, and writes or adds to ``<machine>-<date>-ooc-matrix.*``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..formatting import columns, fmt_value
from .cases import OWN_CLUSTER, Case, case_by_id, cases, workflow_params
from .hostwatch import HostWatch
from .scale import SEED, Scale
from .user_code import USER_CODE, user_size

#: slices in the order to run them; together every case once. First-fit of the cases, most
#: informative first (tall-skinny linear algebra on persisted data, which failed before;
#: then matmul, then rechunk), into slices whose :func:`slice_estimate` at one H100 80 GB
#: stays under :data:`SLICE_BUDGET_S`
SLICES: dict[str, tuple[str, ...]] = {
    "1": ("user-code-qr", "user-code-svd", "user-code-lstsq", "notebook-tsqr"),
    "2": ("cli-tsqr", "cli-svd", "notebook-matmul"),
    "3": ("notebook-svd", "user-code-matmul", "cli-matmul"),
    "4": ("user-code-rechunk", "cli-rechunk", "notebook-rechunk", "user-code-map_overlap"),
    "5": ("user-code-reductions", "cli-fft", "cli-gather"),
    "6": ("cli-slice", "cli-stencil", "notebook-fft", "notebook-gather"),
    "7": ("notebook-slice", "notebook-stencil", "cli-reduction"),
    "8": ("cli-transpose-sum", "notebook-reduction"),
    "9": ("cli-elementwise",),
    "10": ("notebook-transpose-sum", "notebook-elementwise"),
    # the shared service and the batch script, each case with a cluster of its own
    "11": ("service-rechunk", "service-matmul", "batch-rechunk"),
    "12": ("service-svd", "batch-matmul", "batch-svd"),
}

#: a slice's estimate must stay under this (a device call is at most 600 s; the rest is
#: the margin for the estimate's error and the host's start)
SLICE_BUDGET_S = 420


@dataclass(frozen=True)
class Rates:
    """What :func:`estimate` assumes of the GPU host (one H100 80 GB, 16 cores)."""

    #: pinned copies each way, per GPU (measured: about 54 GB/s)
    pinned: float = 54e9
    disk_write: float = 1.1e9
    disk_read: float = 1.6e9
    #: NumPy references from the seeds in processes (:mod:`spillway_bench.reference`, 14 on
    #: 16 cores): 0.25-0.6 GB/s a process measured on a 2-core machine; B3's 423 GB took
    #: 118 s on the 2 x H200 host (3.6 GB/s)
    reference_processes: float = 3.0e9
    #: the workflows' own whole-input references (8 reading threads, one consumer): with
    #: the in-place host generator, a whole-input sum of 184 GB took about 80 s and the
    #: svd's Gram of 99 GB about 50 s on the H200 host (2026-11-25, sixth session)
    reference_threads: float = 2.0e9
    #: FP64 GEMM through dask on one GPU (the issue's 70000^2 matmul: 6.9e14 flops in 21.5 s)
    fp64: float = 35e12
    #: a cli, service or batch case: process, cluster start and stop (measured 9-15 s on the
    #: H100 and H200 hosts: a case's seconds less its run and a window reference); a
    #: slice's local cluster start
    cli_start_s: float = 20.0
    local_start_s: float = 40.0
    #: the copy ceilings measured first in every slice
    ceilings_s: float = 20.0
    #: scheduler and Python per task
    task_s: float = 0.002
    #: what the copies leave out (generating inputs, tasks waiting on restores, the
    #: scheduler): footprint bytes per second, from the issue's one-H100 run of
    #: ``spillway run stencil --param size=110GB`` (61.7 s, 85.5 GB spilled, its copy
    #: bound about 3 s)
    out_of_core: float = 2e9


#: per workflow: passes over the data that leave the device and come back when the
#: footprint is past the device limit, and how the reference is computed:
#: "window" (a few MB of the seeded input), "threads" (the workflow's whole-input
#: reference, by panels), "procs" (:mod:`spillway_bench.reference`, in processes),
#: "procs-half" (two statistics a panel, or row sums: about half the rate)
PROFILE: dict[str, tuple[int, str]] = {
    "elementwise": (1, "threads-slow"), "fft": (3, "window"), "gather": (2, "window"), "matmul": (4, "window"),
    "rechunk": (2, "window"), "reduction": (1, "threads"), "slice": (1, "window"), "stencil": (2, "window"),
    "svd": (2, "threads"), "transpose-sum": (2, "threads"), "tsqr": (2, "threads"),
}
USER_PROFILE: dict[str, tuple[int, str]] = {
    "qr": (2, "procs"), "svd": (2, "procs"), "lstsq": (2, "procs-half"), "matmul": (4, "procs-half"),
    "map_overlap": (1, "window"), "reductions": (2, "procs"), "rechunk": (2, "procs"),
}


def _sizes(case: Case, scale: Scale) -> tuple[int, int, int, int]:
    """(input bytes, projected footprint, input chunks, matmul side or 0) of a case at a scale."""
    from spillway import workflows
    if case.path == "user-code":
        built = USER_CODE[case.workflow](user_size(case, scale), scale, SEED, "numpy")
        chunks = sum(a.npartitions for a in built.inputs.values())
        nbytes = sum(a.nbytes for a in built.inputs.values())
        side = built.inputs["x"].shape[0] if case.workflow == "matmul" else 0
        return nbytes, built.footprint.total_bytes, chunks, side
    params, projected = workflow_params(case, scale)
    _, built = workflows.get(case.workflow).build_run(params, scale.target())
    results = built.result if isinstance(built.result, tuple) else (built.result,)
    chunks = max(getattr(r, "npartitions", 1) for r in results)
    side = int(math.sqrt(built.footprint.input_bytes / 16)) if case.workflow == "matmul" else 0
    return built.footprint.input_bytes, projected, chunks, side


def estimate(case: Case, scale: Scale, rates: Rates = Rates()) -> dict:
    """Seconds one case takes at ``scale``, by part: ``start`` (a cli case's process and
    cluster), ``copies`` (the footprint past the device limit out and back once per pass,
    at the pinned rate per GPU; plus P2P's staging through disk for user-code rechunk),
    ``out_of_core`` (the rest of an out-of-core run, :attr:`Rates.out_of_core`), ``flops``
    (2 n^3 of a matmul), ``tasks`` and ``reference``; and ``total``."""
    nbytes, footprint, chunks, side = _sizes(case, scale)
    limit = scale.worker_bytes * scale.n_workers
    passes, ref = (USER_PROFILE if case.path == "user-code" else PROFILE)[case.workflow]
    over = max(0, footprint - limit)
    copies = passes * 2 * over / (rates.pinned * scale.n_workers)
    reference = {"window": 5.0, "threads": nbytes / rates.reference_threads,
                 "threads-slow": 2 * nbytes / rates.reference_threads,
                 "procs": nbytes / rates.reference_processes,
                 "procs-half": 2 * nbytes / rates.reference_processes}[ref]
    parts = {"start": rates.cli_start_s if case.path in OWN_CLUSTER else 0.0, "copies": copies,
             "out_of_core": footprint / rates.out_of_core if over else 0.0,
             "flops": 2 * side**3 / rates.fp64 if side else 0.0, "tasks": chunks * passes * 4 * rates.task_s,
             "reference": reference}
    return {"case": case.id, "input_bytes": nbytes, "footprint_bytes": footprint, "parts": parts,
            "total": sum(parts.values())}


def slice_estimate(name: str, scale: Scale, rates: Rates = Rates()) -> dict:
    """The slice's cases' estimates, plus the ceilings and (for notebook or user-code
    cases) one local cluster's start."""
    members = [case_by_id(c) for c in SLICES[name]]
    per_case = [estimate(c, scale, rates) for c in members]
    fixed = rates.ceilings_s + (rates.local_start_s if any(c.path not in OWN_CLUSTER for c in members) else 0.0)
    return {"slice": name, "cases": per_case, "fixed_s": fixed, "total": fixed + sum(e["total"] for e in per_case)}


def resolve(selector: str) -> tuple[str, list[Case]]:
    """``1`` ... ``10`` (a slice of :data:`SLICES`), ``all``, or case ids separated by commas:
    ``(name, cases)`` in the order given (cases with a cluster of their own run first all the same)."""
    if selector in SLICES:
        return f"slice-{selector}", [case_by_id(c) for c in SLICES[selector]]
    if selector == "all":
        return "all", cases()
    chosen = []
    for part in (p.strip() for p in selector.split(",") if p.strip()):
        try:
            chosen.append(case_by_id(part))
        except KeyError:
            known = ", ".join(c.id for c in cases())
            raise ValueError(f"matrix: {part!r} is not a slice ({', '.join(SLICES)}, all) or a case ({known})") \
                from None
    if not chosen:
        raise ValueError("matrix: name a slice or cases")
    return "cases", chosen


def run_slice(selector: str, out_dir: Path, *, scale: Scale | None = None, kind: str = "gpu",
              devices: tuple = (0,), local: Callable | None = None, cli_args: tuple[str, ...] = (),
              timeout: float = 540, budget: float | None = None, log: Callable[[str], None] = print,
              machine: str | None = None, directory: str | None = None) -> tuple[list[dict], dict[str, Path]]:
    """Run a slice and add its rows to ``out_dir``'s table of the day, after every case (a
    call cut off keeps what finished). cli, service and batch cases run first (each its own cluster), then the
    others on one ``local()`` cluster. No case starts after ``budget`` seconds: it gets a
    row saying so. Returns the rows and the files written."""
    from .. import copybound
    from ..report import describe_machine
    from .rows import row
    from .run import run_case
    from .table import write_table

    name, chosen = resolve(selector)
    if scale is None:
        from .scale import gpu_scale

        scale = gpu_scale()
    if machine is None:
        from spillway.options.gpus import discover

        machine = describe_machine(discover() if kind == "gpu" else None, kind)["name"]
    started_at = datetime.now(timezone.utc)
    t_start = time.perf_counter()
    log(f"matrix {name} on {machine}: {', '.join(c.id for c in chosen)} at {scale.factor}x "
        f"{scale.device_bytes / 1e9:.1f} GB")
    ceilings = copybound.measure(kind, devices, directory=directory, log=log)["gbps"]
    info = {"name": name, "cases": [c.id for c in chosen], "started": started_at.isoformat(timespec="seconds"),
            "ceilings": ceilings, "scale": {"device_bytes": scale.device_bytes, "factor": scale.factor,
                                            "n_workers": scale.n_workers}}
    rows: list[dict] = []
    paths: dict[str, Path] = {}

    def started(case):
        # a row before the case runs: a call cut off during it still leaves one
        nonlocal paths
        info["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        pending = row(case, scale, error="did not finish: the call ended while it ran")
        paths = write_table([pending], Path(out_dir), machine, when=started_at, slices=[info])

    def watched(case, run):
        """Run one case while the host's memory is sampled; its row with the host columns."""
        started(case)
        with HostWatch() as watch:
            r = run()
        r = {**r, **watch.fields()}
        if r.get("oom_kills") not in ("unknown", None) and r["oom_kills"]:
            r["ok"] = False
            r["error"] = (r.get("error") or "") + f" [kernel OOM kill: {r['oom_kills'][-1][:160]}]"
        return r

    def done(r, t0):
        nonlocal paths
        rows.append(r)
        b = r.get("copy_bound") or {}
        status = "ok" if r["ok"] else "refused" if r["refused"] else "FAILED"
        wall, bound = fmt_value(r["wall_s"], "{:.2f}"), fmt_value(b.get("bound_s"), "{:.2f}")
        log(f"{r['case']:<26} {status:<7} wall {wall} s  bound {bound} s  "
            f"case {time.perf_counter() - t0:.0f} s  {host_cell(r)}  {r['error'] or ''}")
        info["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        paths = write_table([r], Path(out_dir), machine, when=started_at, slices=[info])

    def over_budget(case) -> bool:
        if budget is None or time.perf_counter() - t_start < budget:
            return False
        done(row(case, scale, error=f"not started: the slice's budget of {budget:.0f} s was spent"),
             time.perf_counter())
        return True

    def failed(case, e):
        return row(case, scale, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

    for case in (c for c in chosen if c.path in OWN_CLUSTER):
        if over_budget(case):
            continue
        t0 = time.perf_counter()
        left = timeout if budget is None else max(30.0, min(timeout, budget + 60 - (t0 - t_start)))
        def cli_case(case=case, left=left):
            try:
                return run_case(case, scale, ceilings=ceilings, cluster_args=cli_args, timeout=left)
            except Exception as e:  # a case failing must not lose the slice's other rows
                return failed(case, e)

        done(watched(case, cli_case), t0)
    others = [c for c in chosen if c.path not in OWN_CLUSTER]
    if others:
        import spillway

        try:
            with (local or spillway.local)() as cluster:
                for case in others:
                    if over_budget(case):
                        continue
                    t0 = time.perf_counter()
                    def local_case(case=case):
                        try:
                            return run_case(case, scale, cluster=cluster, ceilings=ceilings)
                        except Exception as e:
                            return failed(case, e)

                    done(watched(case, local_case), t0)
        except Exception as e:  # the cluster did not start, or failed to close
            log(f"local cluster: {type(e).__name__}: {e}")
            for case in others:
                if case.id not in {r["case"] for r in rows}:
                    done(failed(case, e), time.perf_counter())
    return rows, paths


def host_cell(r: dict) -> str:
    """Peak host memory in use / lowest MemAvailable, flagged under the store's headroom,
    and the kernel's OOM kills: ``host 118.2 / 7.7 GB UNDER HEADROOM 12.9 GB, OOM kills 0``."""
    peak, low = r.get("host_peak_used_bytes"), r.get("host_min_available_bytes")
    text = "host " + (f"{peak / 1e9:.1f} / {low / 1e9:.1f} GB" if peak is not None and low is not None else "—")
    if r.get("under_headroom"):
        text += f" UNDER HEADROOM {r['host_headroom_bytes'] / 1e9:.1f} GB"
    kills = r.get("oom_kills", "unknown")
    return text + f", OOM kills {kills if isinstance(kills, str) else len(kills)}"


def short_table(rows: list[dict]) -> str:
    """Printed last: case, status, wall s, copy bound s, ratio, relative error, host memory."""
    table = [("case", "status", "wall s", "bound s", "x bound", "rel error", "host peak / min avail, OOM")]
    for r in rows:
        b = r.get("copy_bound") or {}
        table.append((r["case"], "ok" if r["ok"] else "refused" if r["refused"] else "FAILED",
                      fmt_value(r["wall_s"], "{:.2f}"), fmt_value(b.get("bound_s"), "{:.2f}"),
                      fmt_value(b.get("ratio"), "{:.1f}x"), fmt_value(r["rel_error"], "{:.1e}"),
                      host_cell(r).removeprefix("host ")))
    return columns(table)


def pack(case_ids: list[str], scale: Scale, budget_s: float = SLICE_BUDGET_S, rates: Rates = Rates()) -> list[list[str]]:
    """``case_ids`` in slices whose :func:`slice_estimate` stays under ``budget_s``, first
    fit in the order given (a case estimated over the budget alone gets a slice of its
    own): to resize the slices to another call length, or run what a call left."""
    fixed_cli, fixed_local = rates.ceilings_s, rates.ceilings_s + rates.local_start_s
    slices: list[tuple[list[str], float, bool]] = []
    for case_id in case_ids:
        case = case_by_id(case_id)
        seconds = estimate(case, scale, rates)["total"]
        local = case.path not in OWN_CLUSTER
        for i, (members, total, has_local) in enumerate(slices):
            extra = seconds + (rates.local_start_s if local and not has_local else 0.0)
            if total + extra <= budget_s:
                slices[i] = (members + [case_id], total + extra, has_local or local)
                break
        else:
            slices.append(([case_id], seconds + (fixed_local if local else fixed_cli), local))
    return [members for members, _, _ in slices]


def main(argv: list[str] | None = None) -> None:
    """``python -m spillway_bench.matrix.slices BUDGET_S [CASE,CASE,...]``: the cases (all,
    or those named) packed into slices under BUDGET_S seconds at one H100 80 GB, one
    ``--matrix`` argument a line, with its estimate."""
    import sys

    from .scale import Scale

    args = sys.argv[1:] if argv is None else argv
    budget = float(args[0]) if args else SLICE_BUDGET_S
    ids = args[1].split(",") if len(args) > 1 else [c.id for c in cases()]
    # one H100 80 GB (NVML's bytes), its device limit 80% of it, as the GPU host runs them
    scale = Scale(device_bytes=85_520_809_984, kind="gpu", n_workers=1, worker_bytes=int(0.8 * 85_520_809_984))
    for members in pack(ids, scale, budget):
        fixed = Rates().ceilings_s + (Rates().local_start_s if any(case_by_id(c).path not in OWN_CLUSTER for c in members) else 0)
        total = fixed + sum(estimate(case_by_id(c), scale)["total"] for c in members)
        print(f"{','.join(members)}  # about {total:.0f} s")


if __name__ == "__main__":
    main()
