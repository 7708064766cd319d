"""Which way a rechunk takes on a cluster: the collective, or dask's task-based method.

The collective cuts every input chunk into pieces that are copies (its assemblies then
take them in bulk), and its barrier holds them all before the first assembly: the pieces
of a whole exchange sit in the workers' stores at once, beside what the cluster holds.
Where that fits the workers' fastest tier, it moves the fewest messages there is (on two
H200s, W3 7x and W4 2.8x dask-cuda's task method). Where it does not, those copies are
spilled and restored, and dask's task method, whose pieces are views of their inputs and
whose outputs are joined as their pieces come, is what runs faster: a user's
FFT-rechunk-FFT at 1.4x two H200s' memory took 50.8 s on a fresh cluster (20.4 s after a
minute idle) through the collective in batches, 11.2 s through the task method
(benchmarks/NOTES.md, "Out of core first"). So a rechunk that would not fit goes to dask.

A client asks the scheduler's collective plugin once per rechunk it builds (one round
trip of the scheduler's comm); without a spillway scheduler (dask's local schedulers, a
plain cluster) the collective is taken as before.
"""

from __future__ import annotations

COLLECTIVE = "collective"
TASKS = "tasks"


def way(exchanged: int, room: dict | None) -> str:
    """The method for a rechunk whose exchanging chunks hold ``exchanged`` bytes, on a
    cluster whose workers hold ``room["held"]`` bytes of ``room["fastest"]`` in their
    fastest tiers (None: not known)."""
    if not room or not room.get("fastest"):
        return COLLECTIVE
    return COLLECTIVE if room.get("held", 0) + exchanged <= room["fastest"] else TASKS


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
