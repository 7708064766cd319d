"""Nothing gets slower unseen: each row (per side, and per first run) against the newest
earlier ``spillway bench`` result of the same machine that holds it at the same sizes, in
the results directory (only files git tracks, in a work tree). More than
:data:`THRESHOLD` slower, or failed where it had a time, is ``slower``; a row no earlier
file holds is ``new``.
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from .sides import NAMES as SIDES

#: slower by more than this share of the earlier time is listed
THRESHOLD = 0.10


def is_bench_result(data) -> bool:
    """Whether ``data`` is a ``spillway bench`` results file (not the link sweep's, Zarr's,
    the matrix's or a probe's, which share the directory)."""
    return (isinstance(data, dict) and isinstance(data.get("machine"), dict) and "sizes" in data
            and "runs" in data and isinstance(data.get("workloads"), list)
            and all(isinstance(w, dict) and "name" in w and "spillway_s" in w for w in data["workloads"]))


def tracked(directory: Path) -> set[Path] | None:
    """The files git tracks in ``directory``, resolved; None where it is in no git work
    tree (or git is not there): then every file counts."""
    try:
        proc = subprocess.run(["git", "-C", str(directory), "ls-files", "-z", "--", "."], capture_output=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return {(directory / name).resolve() for name in proc.stdout.decode().split("\0") if name}


def _when(data: dict, path: Path) -> datetime:
    for key in ("finished", "started"):
        try:
            when = datetime.fromisoformat(data[key])
        except (KeyError, TypeError, ValueError):
            continue
        # the bench writes UTC; a time without its zone is read as UTC, so all compare
        return when if when.tzinfo else when.replace(tzinfo=timezone.utc)
    return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)


def earlier_results(where: Path, machine: str, *, exclude: tuple[Path, ...] = ()) -> tuple[list, bool]:
    """``([(path, data), ...] newest first, committed_only)``: the bench results of
    ``machine`` in ``where`` (a directory, or one results file), leaving out ``exclude``."""
    where = Path(where)
    if where.is_file():
        candidates, known = [where], None
    elif where.is_dir():
        known = tracked(where)
        candidates = sorted(where.glob("*.json"))
    else:
        return [], False
    skip = {Path(p).resolve() for p in exclude}
    found = []
    for path in candidates:
        resolved = path.resolve()
        if resolved in skip or (known is not None and resolved not in known):
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if is_bench_result(data) and data["machine"].get("name") == machine:
            found.append((path, data))
    found.sort(key=lambda item: _when(item[1], item[0]), reverse=True)
    return found, known is not None


def size_key(results: dict, entry: dict) -> tuple:
    """What makes two rows of one workload the same size."""
    return (results.get("sizes"), entry.get("input_bytes"), entry.get("chunk_bytes"))


def row_times(entry: dict) -> dict[tuple[str, str], dict]:
    """``{(side, metric): side's JSON}`` for every side that ran or failed (not skipped)
    and each time it has: the median always, the first run where the side records one."""
    out = {}
    for side in SIDES:
        d = entry.get(side)
        if not isinstance(d, dict) or d.get("skipped"):
            continue
        out[(side, "median_s")] = d
        if d.get("first_s") is not None or (entry.get("out_of_core") and "first_s" in d):
            out[(side, "first_s")] = d
    return out


def compare(results: dict, earlier: list, *, committed_only: bool = False, where: Path | None = None,
            threshold: float = THRESHOLD) -> dict:
    """``{"previous": ..., "slower": [...], "new": [...]}`` for ``results`` against the
    ``earlier`` files (:func:`earlier_results`)."""
    slower, new, compared, files = [], [], 0, []
    for entry in results["workloads"]:
        for (side, metric), d in row_times(entry).items():
            seconds = d.get(metric)
            held, match = False, None
            for path, data in earlier:
                old = next((w for w in data["workloads"] if w["name"] == entry["name"]
                            and size_key(data, w) == size_key(results, entry)), None)
                old_side = (old or {}).get(side)
                if not isinstance(old_side, dict) or old_side.get("skipped"):
                    continue
                if metric == "first_s" and "first_s" not in old_side:
                    continue
                held = True
                if old_side.get(metric) is not None:
                    match = (path, data, old_side[metric])
                    break
            label = {"name": entry["name"], "side": side, "metric": metric}
            if not held:
                new.append(label)
                continue
            if match is None:
                continue  # held before, never with a time (a baseline that always failed)
            path, data, before = match
            compared += 1
            if str(path) not in files:
                files.append(str(path))
            ratio = seconds / before if seconds is not None and before else None
            if seconds is None or (ratio is not None and ratio > 1 + threshold):
                slower.append({**label, "seconds": seconds, "previous_s": before, "ratio": ratio,
                               "error": d.get("error") if seconds is None else None,
                               "file": str(path), "previous_started": data.get("started")})
    newest = earlier[0] if earlier else None
    previous = {
        "file": str(newest[0]) if newest else None,
        "started": newest[1].get("started") if newest else None,
        "label": newest[1].get("label") if newest else None,
        "searched": str(where) if where is not None else None,
        "committed_only": committed_only,
        "threshold": threshold,
        "rows_compared": compared,
        "files_compared": files,
    }
    return {"previous": previous, "slower": slower, "new": new}


def describe(row: dict) -> str:
    """``O3 spillway first run`` / ``W1 baseline``."""
    return f"{row['name']} {row['side']}" + (" first run" if row["metric"] == "first_s" else "")


def lines(results: dict) -> list[str]:
    """What the end of a run prints: each row slower than before, or that none is."""
    prev = results.get("previous") or {}
    if not prev.get("file"):
        return [f"previous result: none of this machine in {prev.get('searched') or 'the results directory'}"
                + (" (committed)" if prev.get("committed_only") else "") + "; every row is new"]
    out = []
    for row in results.get("slower") or []:
        now = "failed: " + (row.get("error") or "no time") if row["seconds"] is None else (
            f"{row['seconds']:.3f} s, {100 * (row['ratio'] - 1):+.0f}%")
        out.append(f"slower: {describe(row)}: {now} (was {row['previous_s']:.3f} s in {Path(row['file']).name})")
    pct = f"{100 * prev.get('threshold', THRESHOLD):.0f}%"
    head = (f"previous result: {Path(prev['file']).name}; {prev.get('rows_compared', 0)} rows compared, "
            f"{len(results.get('slower') or [])} slower by more than {pct}, {len(results.get('new') or [])} new")
    return [head, *out]
