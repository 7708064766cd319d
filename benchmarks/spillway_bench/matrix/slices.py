"""Named slices of the matrix, each run in one device call (at most 10 minutes), and the
command that runs one: :func:`run_slice` measures the copy ceilings (before any cluster),
runs the slice's cli, service and batch cases (a cluster each), then its notebook and
user-code cases on one :func:`spillway.local` cluster, and adds each row to
``<machine>-<date>-ooc-matrix.*`` as it finishes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from ..formatting import columns, fmt_value
from .cases import OWN_CLUSTER, Case, case_by_id, cases
from .hostwatch import HostWatch
from .scale import Scale

#: slices in the order to run them; together every case once, the most informative first
#: (tall-skinny linear algebra on persisted data, which failed before; then matmul, then
#: rechunk), each measured under 420 s on one H100 80 GB (results/*-ooc-matrix.json)
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
    from .. import bounds
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
    ceilings = bounds.copy_ceilings(kind, devices, directory=directory, log=log)["gbps"]
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

