"""Which way a rechunk takes on a cluster: the collective, or dask's task-based method.

The collective cuts every input chunk into pieces that are copies (its assemblies then
take them in bulk), and its barrier holds them all before the first assembly: the pieces
of a whole exchange sit in the workers' stores at once, beside what the cluster holds and
what the rechunk's outputs feed. Where that fits the devices, it moves the fewest messages
there is (two H200s: W3 7x and W4 2.8x dask-cuda's task method; a 200 GB panel rechunk in
7.5 s). Where it does not, those copies are spilled and restored, and dask's task method,
whose pieces are views of their inputs, runs several times faster: a user's
FFT-rechunk-FFT of a held 80 GB field (a 160 GB exchange) on two H200s spilled 191 GB and
took 38.4 s on a fresh cluster through the collective, 34 GB and 8.2 s through the task
method (benchmarks/NOTES.md, "Out of core first"). So a rechunk goes to the collective
only where the cluster's bytes and the exchange's take at most :data:`SHARE` of the
workers' fastest tiers together.

A client asks the scheduler's collective plugin once per rechunk it builds (one round
trip of the scheduler's comm); without a spillway scheduler (dask's local schedulers, a
plain cluster) the collective is taken as before.
"""

from __future__ import annotations

COLLECTIVE = "collective"
TASKS = "tasks"
#: the share of the workers' fastest tiers that what they hold and an exchange may take
#: together for the collective. Two H200s' device tiers (80% of 150.8 GB each) hold
#: 241.2 GB: the 200 GB panel rechunk alone (0.83 of them, in memory through the
#: collective) takes it; the FFT's 160 GB exchange beside its 80 GB field (1.00) does not.
#: Set from those two measured cases; the rule sees the cluster and the exchange, not what
#: the graph does with the rechunk's outputs after
SHARE = 0.9


def way(exchanged: int, room: dict | None) -> str:
    """The method for a rechunk whose exchanging chunks hold ``exchanged`` bytes, on a
    cluster whose workers hold ``room["held"]`` bytes of ``room["fastest"]`` in their
    fastest tiers (None: not known)."""
    if not room or not room.get("fastest"):
        return COLLECTIVE
    return COLLECTIVE if room.get("held", 0) + exchanged <= SHARE * room["fastest"] else TASKS


def cluster_room() -> dict | None:
    """The room of the cluster of this process's default client, where its scheduler has
    the collective's plugin; None otherwise."""
    try:
        from distributed import default_client

        client = default_client()
    except (ImportError, ValueError):
        return None
    if getattr(client, "asynchronous", False):
        return None  # the graph is built on the client's own loop: no blocking ask
    try:
        return client.sync(lambda: client.scheduler.spillway_collective_room())
    except Exception:  # noqa: BLE001 (no plugin there, or the scheduler gone: the collective as before)
        return None
