"""Slow request headers against a real `spillway serve` on loopback (issue 45's first case).

Starts a throwaway PostgreSQL 15 on 127.0.0.1 (SQLite where its binaries are missing) and
`spillway serve --cpu` with its default limits (or the --serve-arg ones), then opens
--connections connections from --sources loopback addresses (127.0.1.1, 127.0.1.2, ...),
each sending ``GET /healthz HTTP/1.1`` and one byte of header lines every --interval
seconds (10 B/s by default), never ending its headers; meanwhile a fresh connection from
127.0.0.1 asks /healthz every 50 ms, as a load balancer's health check does, and the file
descriptors of the service's process tree are counted. Stops by itself after the header
deadline plus --extra seconds. Loopback only. Prints one JSON summary (and --out).

    python benchmarks/service/slow_headers.py --connections 3000 --sources 1
    python benchmarks/service/slow_headers.py --connections 3000 --sources 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "service" / "api"))  # the tests' PostgreSQL and serve helpers

from serve_helpers import PostgresServer, Server, add_tenant, healthz_once, new_database, slow_clients  # noqa: E402


def fds(pid: int) -> tuple[int, int]:
    """(the service process's file descriptors, those of it and its workers)."""
    import psutil

    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return 0, 0
    counts = []
    for p in procs:
        try:
            counts.append(p.num_fds())
        except psutil.Error:
            counts.append(0)
    return counts[0], sum(counts)


def quantile(values, q):
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=3000)
    ap.add_argument("--sources", type=int, default=1, help="loopback source addresses, 127.0.1.1 on")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between a connection's bytes")
    ap.add_argument("--header-timeout", type=float, default=10.0, help="the service's (its default)")
    ap.add_argument("--extra", type=float, default=5.0, help="seconds the attack goes on past the deadline")
    ap.add_argument("--serve-arg", action="append", default=[], help="more `spillway serve` flags")
    ap.add_argument("--out")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="spillway-slow-"))
    pg = PostgresServer(Path(tempfile.mkdtemp(prefix="spillway-pg-")))  # its own: the postgres user owns it
    state = {"state_dir": str(tmp / "state")}
    if pg.available:
        pg.init()
        state["db"] = new_database(pg.url)
    server = None
    try:
        add_tenant(state, "ann")
        server = Server(state, "--cpu", "--n-workers", "2", "--header-timeout", str(a.header_timeout),
                        *a.serve_arg).start()
        sources = [f"127.0.1.{i}" for i in range(1, a.sources + 1)]
        result: list[dict] = []
        attack = threading.Thread(target=lambda: result.extend(asyncio.run(slow_clients(
            server.port, sources, a.connections, a.interval, a.header_timeout + a.extra))))
        probes, fd_counts = [], [fds(server.proc.pid)]  # the first before the attack
        t0 = time.monotonic()
        attack.start()
        next_fd = 0.5
        while attack.is_alive():
            probes.append((round(time.monotonic() - t0, 2), *healthz_once(server.port)))
            if time.monotonic() - t0 >= next_fd:
                fd_counts.append(fds(server.proc.pid))
                next_fd += 0.5
            time.sleep(0.05)
        attack.join()
        opened = [r for r in result if "opened" in r]
        lifetimes = sorted(r["closed"] - r["opened"] for r in opened if "closed" in r)
        answers: dict[str, int] = {}
        for r in opened:
            answers[r.get("answer", "-")] = answers.get(r.get("answer", "-"), 0) + 1
        ok = sorted(t for _, t, s in probes if s == 200)
        summary = {
            "connections": a.connections, "sources": a.sources, "bytes_per_s": round(1 / a.interval),
            "header_timeout_s": a.header_timeout, "backend": "postgresql" if state.get("db") else "sqlite",
            "opened": len(opened), "failed_connects": len(result) - len(opened),
            "closed_by_server": len(lifetimes),
            "closed_after_s": {"p50": round(quantile(lifetimes, .5), 3), "p99": round(quantile(lifetimes, .99), 3),
                               "max": round(lifetimes[-1], 3)} if lifetimes else None,
            "answers": answers,
            "probes": len(probes), "probes_ok": len(ok),
            "probe_ms": {"p50": round(quantile(ok, .5) * 1e3, 1), "p99": round(quantile(ok, .99) * 1e3, 1),
                         "max": round(ok[-1] * 1e3, 1)} if ok else None,
            "probes_over_100ms": sum(1 for _, t, s in probes if s != 200 or t > 0.1),
            "slowest_probes": sorted(([at, round(t * 1e3, 1), s] for at, t, s in probes), key=lambda p: -p[1])[:5],
            "serve_fds": {"before": fd_counts[0][0], "max": max(f for f, _ in fd_counts),
                          "every_2s": [f for f, _ in fd_counts[::4]]} if fd_counts else None,
            "tree_fds": {"before": fd_counts[0][1], "max": max(t for _, t in fd_counts)} if fd_counts else None,
            "load_average": os.getloadavg(),
        }
        print(json.dumps(summary))
        if a.out:
            Path(a.out).write_text(json.dumps(summary, indent=1))
    finally:
        if server is not None:
            server.stop()
        if pg.available:
            pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(pg.root, ignore_errors=True)


if __name__ == "__main__":
    main()
