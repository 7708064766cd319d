"""The service's latency targets, measured: ``/healthz`` while clients stall the API (issue
53: slow bodies from 20 addresses, slow readers, endless header lines) and the submission
latency of 200 jobs from 10 tenants at once, against their targets.

The loads are the tests' own (``tests/service/api/test_stalls.py`` and ``test_load.py``,
which check only that every request is answered, within a liveness deadline): this runs
them with pytest on loopback (PostgreSQL 15 where its binaries are installed, else SQLite),
collects the figures they record, and prints each beside its target. Timings depend on the
machine and what else runs on it, so they are figures to compare, not a test's verdict.

    python benchmarks/service/latency.py                 # all, ~3 min on the 2-core host
    python benchmarks/service/latency.py --only load --out benchmarks/service/results/latency.jsonl
    python benchmarks/service/latency.py --strict        # exit 1 when a target is missed

Issue 63's round: 1,200 slow bodies from 20 addresses held for 40 s (the service's body
deadline 40 s), every /healthz under 0.5 s; with a PNG of every probe's latency:

    python benchmarks/service/latency.py --only stalls -k slow_bodies --bodies-s 40 --bodies 1200 \
        --out benchmarks/service/results/latency-2026-11-28-2core.jsonl --plot healthz.png

Issue 74's target, /healthz under 100 ms both while six clients with a tenant's token send
60,000-key bodies (parsed, then refused) and through issue 63's round; the figures written
as ``<machine>-<date>-service-latency.{json,md}`` under --results:

    python benchmarks/service/latency.py --only stalls -k "no_load or slow_bodies or 60000" \
        --control-s 40 --bodies-s 40 --bodies 1200 --big-rounds 10 --results benchmarks/results

(``no_load`` is the control: /healthz with nothing else sent, the machine's own figures; a
shared host's neighbours show there.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
API_TESTS = ROOT / "tests" / "service" / "api"

#: which test's figures, and the targets they are held to: (figure, bound in ms, what it
#: means[, the records it applies to: those whose name contains this])
LOADS = {
    "stalls": (API_TESTS / "test_stalls.py", [("p90_ms", 500, "/healthz p90 under 0.5 s (issue 53's target)"),
                                              ("max_ms", 2500, "/healthz never 2.5 s (five times the target)"),
                                              ("max_ms", 500, ("every /healthz under 0.5 s through 1,200 slow "
                                                                "bodies held 40 s (issue 63)"),
                                               "1,200 slow bodies held 40 s"),
                                              ("max_ms", 100, ("every /healthz under 100 ms through 1,200 slow "
                                                               "bodies held 40 s (issue 74)"),
                                               "1,200 slow bodies held 40 s"),
                                              ("max_ms", 100, ("every /healthz under 100 ms while six clients "
                                                               "send 60,000-key bodies (issue 74)"),
                                               "60,000-key bodies")]),
    "load": (API_TESTS / "test_load.py", [("p99_ms", 10_000, "a submission's p99 under 10 s")]),
}


def run(only: list[str], figures_file: Path, select: str | None = None, bodies_s: float | None = None,
        bodies: int | None = None, big_rounds: int | None = None, control_s: float | None = None) -> int:
    env = {**os.environ, "SPILLWAY_LATENCY_OUT": str(figures_file),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    # the slow-body round's length and size, read by test_stalls.py (its own are CI's short ones)
    if bodies_s is not None:
        env["SPILLWAY_STALLS_BODY_S"] = str(bodies_s)
    if bodies is not None:
        env["SPILLWAY_STALLS_BODIES"] = str(bodies)
    if big_rounds is not None:
        env["SPILLWAY_STALLS_BIG_ROUNDS"] = str(big_rounds)
    if control_s is not None:
        env["SPILLWAY_STALLS_CONTROL_S"] = str(control_s)
    tests = [str(LOADS[name][0]) for name in only]
    # -m slow: both modules are of the slow set; -s shows their own lines as they go
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-m", "slow", *tests,
           *(["-k", select] if select else [])]
    print("==", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode


def compare(only: list[str], records: list[dict]) -> list[dict]:
    rows = []
    for name in only:
        _, targets = LOADS[name]
        for record in (r for r in records if _from(r, name)):
            for figure, bound_ms, meaning, *applies in targets:
                if applies and applies[0] not in record["name"]:
                    continue
                value = record.get(figure)
                rows.append({"load": record["name"], "figure": figure, "value_ms": value, "target_ms": bound_ms,
                             "met": value is not None and value < bound_ms, "target": meaning})
    return rows


def _from(record: dict, load: str) -> bool:
    return record["name"].startswith("healthz during") == (load == "stalls")


def machine() -> dict:
    """What the figures were measured on: they depend on it."""
    import platform
    import time

    import psutil
    from spillway_bench.report import cpu_model

    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "host": platform.node(), "cpus": os.cpu_count(),
            "cpu": cpu_model(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "load_average_after": [round(x, 2) for x in os.getloadavg()], "python": platform.python_version()}


def plot(records: list[dict], path: Path) -> None:
    """Each round's /healthz probes, latency against the time since its first probe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [r for r in records if r.get("series_s_ms")]
    fig, ax = plt.subplots(figsize=(9, 4))
    for r in series:
        t, ms = zip(*r["series_s_ms"])
        ax.plot(t, ms, ".", ms=3, label=f"{r['name']} (max {r['max_ms']} ms)")
    ax.axhline(500, color="red", lw=0.8, ls="--", label="0.5 s")
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the first probe")
    ax.set_ylabel("/healthz, ms (fresh connection)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def machine_name(described: dict) -> str:
    """Named as the other CPU results are (``cpu-<cores>core-<vendor>``)."""
    cpu = described["cpu"]
    vendor = "amd-epyc" if "EPYC" in cpu else (re.sub(r"[^a-z0-9]+", "-", cpu.lower()).strip("-") or "cpu")
    return f"cpu-{described['cpus']}core-{vendor}"


def write_results(directory: Path, described: dict, settings: dict, label: str | None, records: list[dict],
                  rows: list[dict]) -> tuple[Path, Path]:
    """``<machine>-<date>-service-latency.json`` (every figure, the probes' series left out)
    and ``.md`` (the table)."""
    stem = directory / f"{machine_name(described)}-{described['date'][:10]}-service-latency"
    # the series left out but its five slowest probes (seconds into the load, ms): when a
    # maximum came says what caused it
    figures = [{**{k: v for k, v in r.items() if k != "series_s_ms"},
                **({"slowest_s_ms": sorted(r["series_s_ms"], key=lambda p: -p[1])[:5]} if r.get("series_s_ms") else {})}
               for r in records]
    stem.with_suffix(".json").write_text(json.dumps({"machine": described, "settings": settings, "label": label,
                                                     "figures": figures, "comparisons": rows}, indent=1) + "\n")
    lines = [f"# /healthz latency of `spillway serve --cpu` under load ({described['date']})", "",
             f"{described['cpus']} CPUs ({described['cpu']}), {described['memory_gib']} GiB; load average after "
             f"{described['load_average_after']}; `python benchmarks/service/latency.py` {json.dumps(settings)}"
             + (f"; {label}" if label else ""), "",
             "| load | probes | p50 ms | p90 ms | max ms | backend |", "| --- | --- | --- | --- | --- | --- |"]
    for r in figures:
        lines.append(f"| {r['name'].removeprefix('healthz during ')} | {r.get('probes')} | {r.get('p50_ms')} | "
                     f"{r.get('p90_ms')} | {r.get('max_ms')} | {r.get('backend', '')} |")
    lines += ["", "| load | figure | value ms | target | met |", "| --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(f"| {row['load'].removeprefix('healthz during ')} | {row['figure']} | {row['value_ms']} | "
                     f"< {row['target_ms']} ms: {row['target']} | {'yes' if row['met'] else 'NO'} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"results: {stem}.json, {stem}.md")
    return stem.with_suffix(".json"), stem.with_suffix(".md")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(LOADS), help=f"comma-separated, of {', '.join(LOADS)}")
    ap.add_argument("--out", type=Path, help="append the figures and their comparisons here (JSON lines)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("-k", dest="select", help="only the tests pytest -k selects (slow_bodies: that round alone)")
    ap.add_argument("--bodies-s", type=float, help="seconds the slow bodies are held (the service's body "
                                                   "deadline; test_stalls.py's own: 4)")
    ap.add_argument("--bodies", type=int, help="slow bodies in the round (test_stalls.py's own: 1,200)")
    ap.add_argument("--control-s", type=float, help="seconds of /healthz alone, the control round "
                                                    "(test_stalls.py's own: 5)")
    ap.add_argument("--big-rounds", type=int, help="60,000-key bodies each of the six clients sends, one "
                                                   "after another (test_stalls.py's own: 4)")
    ap.add_argument("--results", type=Path, help="write the figures and comparisons to "
                                                 "DIR/<machine>-<date>-service-latency.{json,md} (a later "
                                                 "run of the same day replaces them)")
    ap.add_argument("--label", help="a note written with the figures to --out (what was measured)")
    ap.add_argument("--plot", type=Path, help="a PNG of every /healthz probe's latency over each round (matplotlib)")
    args = ap.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in only if name not in LOADS]
    if unknown:
        ap.error(f"--only: {', '.join(unknown)} is not one of {', '.join(LOADS)}")
    with tempfile.TemporaryDirectory(prefix="spillway-latency-") as tmp:
        figures_file = Path(tmp) / "figures.jsonl"
        status = run(only, figures_file, args.select, args.bodies_s, args.bodies, args.big_rounds,
                     args.control_s)
        records = [json.loads(line) for line in figures_file.read_text().splitlines()] if figures_file.exists() else []
    rows = compare(only, records)
    print()
    print(f"{'load':<45} {'probes':>6} {'p50 ms':>8} {'p90 ms':>8} {'max ms':>8}")
    for r in records:
        if "max_ms" in r:
            print(f"{r['name'].removeprefix('healthz during '):<45} {r.get('probes')!s:>6} {r.get('p50_ms')!s:>8} "
                  f"{r.get('p90_ms')!s:>8} {r['max_ms']!s:>8}")
    print()
    for row in rows:
        verdict = "met" if row["met"] else "MISSED"
        print(f"{row['load']:<45} {row['figure']:<7} {row['value_ms']!s:>9} ms  target < {row['target_ms']} ms  "
              f"{verdict}")
    if args.plot:
        plot(records, args.plot)
    if args.results and records:
        settings = {"only": only, "k": args.select, "bodies_s": args.bodies_s, "bodies": args.bodies,
                    "big_rounds": args.big_rounds,
                    "control_s": args.control_s}
        write_results(args.results, machine(), settings, args.label, records, rows)
    if args.out:
        with args.out.open("a") as f:
            f.write(json.dumps({"machine": machine(), "settings": {"only": only, "k": args.select,
                                                                   "bodies_s": args.bodies_s,
                                                                   "bodies": args.bodies},
                                "label": args.label}) + "\n")
            for record in records:
                f.write(json.dumps({"figures": record}) + "\n")
            for row in rows:
                f.write(json.dumps({"comparison": row}) + "\n")
    if status != 0:
        print(f"the loads' tests failed (pytest exit {status}): their figures above are partial", file=sys.stderr)
        return status
    if not rows:
        print("no figures were recorded", file=sys.stderr)
        return 1
    return 1 if args.strict and not all(row["met"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
