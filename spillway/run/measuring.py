"""Measuring a spillway cluster: what each worker's collective, data plane, Zarr decoder
and tiered store did since the worker started.

This is the supported way to read those figures. Each function runs on a worker, with
``client.run`` (which answers with a dict: worker address -> what the function returned
there), or is called on a worker from a task:

.. code-block:: python

    from spillway.run import measuring

    before = client.run(measuring.store_moves)
    ...  # a computation
    after = client.run(measuring.store_moves)

The counters only grow while a worker lives: what a computation did is the difference
between a reading before and one after it. A function answers None on a worker that
lacks what it reads (no data plane over TCP, distributed's own store, no collective run
there yet). The shapes, per worker:

- :func:`collective_phases`: ``{"seconds": {phase: s}, "counts": {phase: n},
  "median": {phase: s}, "taken_bytes": n}``, the phases of
  :class:`spillway.datapath.collective.state.Phases`;
- :func:`plane_counters`: ``{"fetched", "fetched_bytes", "fetch_s", "served",
  "served_bytes", "busy", "fallbacks", "lost", "connect_failures", "serve_errors",
  "warmed", "refused", "slotted", "phases": {"fetch_reply" ...: {"median_s", "total_s",
  "max_s"}}}`` (:class:`spillway.datapath.plane.plane.Counters`), and with
  ``traces=True`` the latest fetches and serves one by one (``fetch_trace``,
  ``serve_trace``: lists of ``{phase: s}``);
- :func:`decode_counters`: ``{"gpu": {...}, "host": {...}, "stages": {stage: {...}},
  "host_buffers": {...}}``, the zstd bytes, frames and seconds decoded on the GPU and on
  the host (:func:`spillway.workflows.zarr.decoded.decode_counters`); every worker has
  them, at zero where it decoded nothing;
- :func:`store_moves`: ``{"bytes": {move: n}, "seconds": {move: s}, "count": {move: n},
  "wait_s", "producer_wait_s", "prefetched_bytes", "ondemand_events",
  "ondemand_bytes"}``, the moves between the tiered store's tiers (with its default
  tiers ``device_to_host``, ``host_to_device``, ``host_to_disk`` and ``disk_to_host``:
  :data:`spillway.memory.store.MOVES`);
- :func:`store_summary`: the store's tiers now (bytes and keys a tier, its host
  buffers, its books, and ``stats``, the moves above): :meth:`spillway.memory.store.TieredStore.summary`;
- :func:`measure`: all of the above in one dict (``collective``, ``plane``, ``decode``,
  ``store_moves``, ``store``), one round trip a worker.

The bench (``benchmarks/spillway_bench``) reads its figures here, as a notebook would.
A whole run's report (transfers, spills, peaks of one computation) is
:func:`spillway.launch.plugins.worker_snapshot`, diffed by :mod:`.stats`.

Each function imports what it reads when called: this module loads nothing of the
cluster, and ``client.run`` sends the function by name.
"""

from __future__ import annotations


def collective_phases(dask_worker=None) -> dict | None:
    """Where this worker's collective tasks spent their time, phase by phase, since it
    started; None where no collective task ran on it."""
    from spillway.datapath.collective.state import state_of

    state = state_of(dask_worker)
    return None if state is None or not state.phases.counts else state.phases.as_dict()


def step_phases(dask_worker=None) -> dict | None:
    """Where this worker's exchange steps spent their time (begin: from the task's start to
    its rendezvous; rendezvous: waiting for its peers; then a round's cut, move, join, store), the
    bytes they received, and the rounds each transport moved (``transports``: which the
    cluster's exchanges chose), since it started; None where no step ran on it."""
    from spillway.datapath.step.state import state_of

    state = state_of(dask_worker)
    if state is None or not state.phases.counts:
        return None
    return {**state.phases.as_dict(), "transports": dict(state.moved_over)}


def plane_counters(dask_worker=None, traces: bool = False) -> dict | None:
    """This worker's data-plane counters (fetches, serves, busy replies, requests that went
    over the comm instead) and its phases; ``traces``: the latest fetches and serves one
    by one too. None where the worker has no plane."""
    from spillway.datapath.plane.hook import counters

    return counters(dask_worker, traces=traces)


def decode_counters(dask_worker=None) -> dict:
    """The zstd bytes, frames and seconds this worker's process decoded (GPU and host), the
    host path's stages and its decode buffers."""
    from spillway.workflows.zarr.decoded import decode_counters as counters

    return counters(dask_worker)


def store_moves(dask_worker=None) -> dict | None:
    """Bytes, seconds and count of each move between this worker's tiers, and the time
    tasks waited for restores; None where the worker keeps another store."""
    store = _store(dask_worker)
    return None if store is None else store.stats.to_json()


def store_summary(dask_worker=None) -> dict | None:
    """This worker's tiered store now: each tier's bytes and keys, and its moves; None
    where the worker keeps another store."""
    store = _store(dask_worker)
    return None if store is None else store.summary()


def measure(dask_worker=None) -> dict:
    """Every reading of this module on this worker, in one call."""
    return {"collective": collective_phases(dask_worker), "step": step_phases(dask_worker),
            "plane": plane_counters(dask_worker),
            "decode": decode_counters(dask_worker), "store_moves": store_moves(dask_worker),
            "store": store_summary(dask_worker)}


def _store(dask_worker):
    from spillway.memory.store import TieredStore

    data = getattr(dask_worker, "data", None)
    return data if isinstance(data, TieredStore) else None
