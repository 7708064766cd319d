"""Users' own rechunks, and their map_overlaps' halos, take the collective on a spillway
cluster, unchanged.

dask picks a rechunk's method by itself (``array.rechunk.method``, else the task-based
method for small graphs and peer-to-peer for large ones once a distributed client is
about) and then calls ``distributed.shuffle.rechunk_p2p``, looked up at each call (the
seam ``rechunk_p2p`` of :mod:`spillway.upstream`). While a
process has a spillway session open, that name is :func:`rechunk_p2p` here: for a
client of a session's cluster (the session's own, or another the user opened to its
scheduler) it is the collective
(dask's P2P sizes its shards with ``memoryview`` and stages them through host memory and
disk, which CuPy chunks cannot take), and it hands any other client's rechunk to
distributed's own function unchanged. dask's ``overlap`` calls ``overlap_internal`` of its
module by name (the seam ``overlap_internal``): on a spillway cluster the halos are one
exchange where they are many pieces (:func:`_few_pieces`); elsewhere dask's own tasks.

dask names no hook for a rechunk's method, so the name is replaced in the process; which
clusters it serves is read from the sessions' clients alive now (:func:`_on_spillway`),
not kept as addresses: a session's cluster stops taking the collective when its client
closes, and a later cluster on the same port is not taken for it.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
import weakref

from spillway.upstream import route, unroute

#: the clients of this process's spillway sessions (weak: one dropped leaves)
_SESSIONS: weakref.WeakSet = weakref.WeakSet()
_lock = threading.Lock()
_original = None
_original_overlap = None
#: set inside :func:`dask_halos`: overlaps built there keep dask's own tasks
_dask_halos = contextvars.ContextVar("spillway_dask_halos", default=False)


@contextlib.contextmanager
def dask_halos():
    """Build map_overlap's halos with dask's own tasks inside this block, on any cluster:
    what ``array.rechunk.method: tasks`` is to a rechunk (the graph is built when
    ``map_overlap`` is called, so only the call needs to be inside)."""
    token = _dask_halos.set(True)
    try:
        yield
    finally:
        _dask_halos.reset(token)


def rechunk_p2p(x, chunks, threshold=None, block_size_limit=None, balance=False, **kwargs):
    if _on_spillway():
        from .graph import rechunk

        return rechunk(x, chunks)
    return _original(x, chunks, threshold=threshold, block_size_limit=block_size_limit, balance=balance, **kwargs)


def overlap_internal(x, axes):
    """dask's ``overlap_internal`` (each chunk grown by its neighbours' faces, what
    ``map_overlap`` runs on): on a spillway cluster one exchange (:func:`.graph.overlap_internal`),
    dask's own elsewhere."""
    if _on_spillway() and not _dask_halos.get():
        from .graph import exchangeable, overlap_windows
        from .graph import overlap_internal as exchanged
        from .layout import plan_of

        # an array with no plan is the graph's to hand back (:func:`.graph.exchangeable`)
        plan = plan_of(x.chunks, overlap_windows(x.chunks, axes)) if exchangeable(x) else None
        if plan is None or not _few_pieces(x, plan):
            return exchanged(x, axes, fallback=_original_overlap, plan=plan)
    return _original_overlap(x, axes)


def _few_pieces(x, plan) -> bool:
    """Whether dask's own halos are few enough to keep, by the rule dask picks a rechunk's
    method by: its task-based method while the pieces are fewer than
    ``array.rechunk.threshold`` times the input and output chunks, peer-to-peer from
    there. The collective makes a task an input and output chunk and a barrier a partial,
    dask's own about a task a piece: below the line it saves few tasks, and on small
    grids its barriers can outnumber what it saves (a map_overlap along one axis of 10 x
    10 chunks, a barrier a column, was a graph of 510 tasks against 501 along both axes,
    which dask's own tests of small overlaps refuse). So a halo along one axis stays dask's
    own (about three pieces a chunk), and one along two or three axes takes the exchange
    on all but small grids (``plan``: the halos' windows' plan)."""
    import dask

    threshold = dask.config.get("array.rechunk.threshold")
    return plan.pieces() < threshold * (math.prod(x.numblocks) * 2)


def _on_spillway() -> bool:
    """Whether dask's default client is on a spillway session's cluster: the session's own
    client, or one open to the same scheduler."""
    try:
        from distributed import default_client

        client = default_client()
    except (ImportError, ValueError):
        return False
    live = _live()
    if client in live:
        return True
    address = _address(client)
    return address is not None and address in {_address(c) for c in live}


def _live() -> list:
    return [c for c in list(_SESSIONS) if getattr(c, "status", None) not in ("closing", "closed")]


def _address(client) -> str | None:
    try:
        return client.scheduler.address
    except AttributeError:
        return None


def use_on(client) -> None:
    """Route dask's peer-to-peer rechunks and overlaps' halos on the cluster of session
    client ``client`` to the collective, until :func:`stop_using` (or the client's close)."""
    global _original, _original_overlap
    with _lock:
        _SESSIONS.add(client)
        if _original is None:
            _original = route("rechunk_p2p", rechunk_p2p)
        if _original_overlap is None:
            _original_overlap = route("overlap_internal", overlap_internal)


def stop_using(client) -> None:
    """``client``'s cluster takes dask's own methods again; with no session left, dask's
    own names are put back."""
    global _original, _original_overlap
    with _lock:
        _SESSIONS.discard(client)
        if _live():
            return
        if _original is not None:
            unroute("rechunk_p2p", _original)
            _original = None
        if _original_overlap is not None:
            unroute("overlap_internal", _original_overlap)
            _original_overlap = None
