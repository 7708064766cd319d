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

#: the name of the worker plugin that holds a worker's plane (:mod:`.plugin`)
PLUGIN_NAME = "spillway-dataplane"
_original = None


def plane_of(worker):
    """``worker``'s plane, held by its data-plane plugin; None without one."""
    plugins = getattr(worker, "plugins", None) or {}
    return getattr(plugins.get(PLUGIN_NAME), "plane", None)


def plane_at(address):
    """The plane of this process's worker at ``address`` (several workers may share a
    process: tests, in-process clusters); None where it has none."""
    for worker in upstream.workers_of_process():
        if worker.address == address:
            return plane_of(worker)
    return None


async def routed_fetch(rpc, keys, worker, *, who=None, serializers=None, deserializers=None):
    """distributed's gather of ``keys`` from ``worker``, over the plane where it can."""
    plane = plane_at(who)
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
    if _original is not None and not any(plane_of(w) is not None for w in upstream.workers_of_process()):
        upstream.unroute_gathers(_original)
        _original = None


def counters(dask_worker=None, traces: bool = False) -> dict | None:
    """This worker's plane's counters (``client.run(counters)``; ``traces``: its kept
    fetches and serves too), None without a plane. Users measure a cluster through
    :func:`spillway.run.measuring.plane_counters`."""
    plane = plane_of(dask_worker)
    return None if plane is None else plane.counters.as_dict(traces=traces)
