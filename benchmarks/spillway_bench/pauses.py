"""Python's garbage collector pauses in the bench's processes: the client's (which runs the
local scheduler) and each worker's. A full collection of a process holding a large graph
stops its event loop for a while; a timed run that stalls with no task, transfer or
device work to show for it is read against these.
"""

from __future__ import annotations

import gc
import time

#: pauses shorter than this are not kept
KEEP_S = 0.005

_PAUSES: list = []
_STARTED: dict = {}


def _callback(phase: str, info: dict) -> None:
    if phase == "start":
        _STARTED["at"] = time.perf_counter()
        return
    began = _STARTED.pop("at", None)
    if began is not None:
        took = time.perf_counter() - began
        if took >= KEEP_S:
            _PAUSES.append((info.get("generation", -1), took))


def watch(dask_worker=None) -> None:
    """Keep this process's collections from now on (idempotent; ``client.run`` takes it)."""
    if _callback not in gc.callbacks:
        gc.callbacks.append(_callback)


def taken(dask_worker=None) -> dict:
    """The pauses kept since the last call (and forgets them): count, longest, sum, each
    generation's count."""
    found = list(_PAUSES)
    _PAUSES.clear()
    by_generation: dict = {}
    for generation, _ in found:
        by_generation[generation] = by_generation.get(generation, 0) + 1
    return {"count": len(found), "max_s": max((t for _, t in found), default=0.0),
            "sum_s": sum(t for _, t in found), "by_generation": by_generation}


def line(client) -> str | None:
    """One line of the pauses since the last call in this process and on each worker; None
    where there were none."""
    here = taken()
    workers = client.run(taken)
    parts = []
    for who, p in [("client+scheduler", here), *sorted(workers.items())]:
        if p["count"]:
            parts.append(f"{who}: {p['count']} over {KEEP_S * 1e3:.0f} ms, longest {p['max_s'] * 1e3:.0f} ms, "
                         f"sum {p['sum_s'] * 1e3:.0f} ms")
    return "; ".join(parts) or None
