"""The tiers' bound of one run (O3, O4): the least time its moves between device, host,
disk and the other workers take at the rates measured in the same bench run.

    bound_s = device_to_host / (d2h_pinned * links) + host_to_device / (h2d_pinned * links)
            + between_workers / (peer_copy * links)
            + host_to_disk / disk_write + disk_to_host / disk_read

The bytes are the run's, summed over its workers: each move between tiers from the spill
counters (:func:`spillway_bench.measure.spill_moves`), the bytes between workers from
their incoming-transfer logs. The rates are the ceilings (:mod:`.ceilings`), ``peer_copy``
being the one a transfer between workers is read against (``same_gpu_copy`` where the
workers share a GPU).

The workers copy in parallel, so the bound takes the total divided by the GPUs
(``links``), not the total: each GPU has a host link and a link in from the others of its
own, and the slowest worker, whose copies the run waits for, moves at least the average
share. (The largest worker's share would be tighter, but the counters come summed, as
the rest of the bench reads them; on an even spread the two agree.) Workers that share a
GPU share its links, hence GPUs, not workers. The disk is the host's one, shared by every
worker: its moves are not divided, and its ceilings were measured by the disk tier with its
own parallel writers. The moves are added, not overlapped, as :mod:`.copybound` does: a run
that overlaps copies each way with each other or with the page cache can come in under it.
"""

from __future__ import annotations

from collections.abc import Mapping

from .copybound import PER_GPU, copy_bound

#: the bytes between workers and the ceiling they are read against
BETWEEN = "between_workers"
PEER_CEILINGS = ("peer_copy", "same_gpu_copy")


def tiers_bound(moves: Mapping[str, int] | None, bytes_moved: int | None, gbps: Mapping[str, float] | None,
                links: int = 1) -> dict:
    """``{"bound_s", "terms": {move: {bytes, ceiling, ceiling_gbps, divided_by, seconds}},
    "missing", "links"}`` for ``moves`` (bytes by move between tiers, summed over the
    workers) and ``bytes_moved`` between workers, at the rates ``gbps`` over ``links``
    GPUs. ``bound_s`` is None where a move that happened has no measured rate (``missing``
    names it), 0 where nothing moved."""
    gbps = gbps or {}
    links = max(1, int(links))
    # the moves between tiers are the copy bound's (:func:`.copybound.copy_bound`); the
    # moves between workers are added here, over the link each GPU has in from the others
    tiers = copy_bound(moves, gbps, links)
    terms = {move: {**t, "divided_by": links if move in PER_GPU else 1} for move, t in tiers["moves"].items()}
    missing = list(tiers["missing"])
    nbytes = int(bytes_moved or 0)
    if nbytes > 0:
        name = next((n for n in PEER_CEILINGS if gbps.get(n)), PEER_CEILINGS[0])
        rate = gbps.get(name)
        if not rate:
            missing.append(name)
        terms[BETWEEN] = {"bytes": nbytes, "ceiling": name, "ceiling_gbps": rate, "divided_by": links,
                          "seconds": nbytes / (rate * 1e9 * links) if rate else None}
    bound = None if missing else sum(t["seconds"] for t in terms.values())
    return {"bound_s": bound, "terms": terms, "missing": missing, "links": links}


def side_bounds(side: Mapping, gbps: Mapping[str, float] | None, links: int) -> dict:
    """A side's bounds from its JSON (:meth:`~.measure.SideResult.to_json`): the median
    timed run's (median bytes of each move) and the first run's, each with its time and
    their ratio. Fields: ``bound_s``, ``time_over_bound``, ``tiers_bound``, and the
    same with ``first_``; beside them the forced-bytes bound (:mod:`.forcedbound`):
    ``forced_bound_s``, ``time_over_forced`` and ``forced_bound`` (its terms and each
    move's ``moved_over_forced``), and the first run's."""
    from .copybound import move_bytes

    # a side that failed or did not run has no bound: its bytes are a part of a run
    ran = side.get("median_s") is not None
    median = tiers_bound(move_bytes(side.get("spill_moves")), side.get("bytes_moved"), gbps, links)
    first = None
    if side.get("first_s") is not None:
        first = tiers_bound(move_bytes(side.get("first_spill_moves")), side.get("first_bytes_moved"), gbps, links)
    from .forcedbound import forced_bound

    forced = forced_bound(side.get("forced_moves"), move_bytes(side.get("spill_moves")), gbps, links,
                          side.get("median_s")) if ran else None
    first_forced = forced_bound(side.get("first_forced_moves"), move_bytes(side.get("first_spill_moves")), gbps,
                                links, side.get("first_s"))
    return {
        "forced_bound_s": (forced or {}).get("forced_bound_s"),
        "time_over_forced": (forced or {}).get("time_over_forced"),
        "forced_bound": forced,
        "first_forced_bound_s": (first_forced or {}).get("forced_bound_s"),
        "first_over_forced": (first_forced or {}).get("time_over_forced"),
        "first_forced_bound": first_forced,
        "bound_s": median["bound_s"] if ran else None,
        "time_over_bound": _ratio(side.get("median_s"), median["bound_s"]),
        "tiers_bound": median if ran else None,
        "first_bound_s": (first or {}).get("bound_s"),
        "first_over_bound": _ratio(side.get("first_s"), (first or {}).get("bound_s")),
        "first_tiers_bound": first,
    }


def _ratio(a, b):
    return a / b if a is not None and b else None
