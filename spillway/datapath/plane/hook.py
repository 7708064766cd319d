"""Where the data plane meets distributed: the function a worker's ``gather_dep`` (and
``Worker.gather``) looks up by name at each call to fetch keys from a peer is routed
(:func:`~spillway.upstream.route_gathers`) to the plane of the asking worker
(``who``) when the peer has one too, and to distributed's comm otherwise.

A module function and its contract are all this relies on (the name, its keywords, the
OK/busy reply, ``OSError`` for a lost peer): everything else of a gather stays
distributed's (the state machine's events, throttling, retries, the incoming transfer log
and its metrics). Where this distributed has no such function of the known shape, the
plane stays off (the log says so once) and gathers go over the comm, correct and slower;
:func:`counters` then show the plane idle.
"""

from __future__ import annotations

from spillway import upstream

#: worker address -> its plane (several workers may share a process: tests, in-process clusters)
PLANES: dict = {}
_original = None


async def routed_fetch(rpc, keys, worker, *, who=None, serializers=None, deserializers=None):
    """distributed's gather of ``keys`` from ``worker``, over the plane where it can."""
    plane = PLANES.get(who)
    if plane is not None and await plane.reaches(worker):
        response = await plane.fetch(worker, keys)
        if response is not None:
            return response
    return await _original(rpc, keys, worker, who=who, serializers=serializers, deserializers=deserializers)


def install() -> bool:
    """Route gathers through :func:`routed_fetch` (once per process); False where this
    distributed cannot be routed (the plane is off)."""
    global _original
    if _original is None:
        _original = upstream.route_gathers(routed_fetch)
    return _original is not None


def uninstall() -> None:
    """Give distributed its own function back once no plane of this process is left."""
    global _original
    if _original is not None and not PLANES:
        upstream.unroute_gathers(_original)
        _original = None


def counters(dask_worker=None, traces: bool = False) -> dict | None:
    """This worker's plane's counters (``client.run(counters)``; ``traces``: its kept
    fetches and serves too), None without a plane. Users measure a cluster through
    :func:`spillway.run.measuring.plane_counters`."""
    plane = PLANES.get(getattr(dask_worker, "address", None))
    return None if plane is None else plane.counters.as_dict(traces=traces)
