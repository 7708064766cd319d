"""Where the data plane meets distributed: ``distributed.worker.get_data_from_worker``,
which a worker's ``gather_dep`` (and ``Worker.gather``) looks up by name at each call, is
routed to the plane of the asking worker (``who``) when the peer has one too, and to
distributed's comm otherwise.

A module function and its contract are all this relies on (the name, its keywords, the
OK/busy reply, ``OSError`` for a lost peer): everything else of a gather stays
distributed's (the state machine's events, throttling, retries, the incoming transfer log
and its metrics). Should a later distributed stop calling it, gathers go over the comm
again, correct and slower, and :func:`counters` show the plane idle.
"""

from __future__ import annotations

#: worker address -> its plane (several workers may share a process: tests, in-process clusters)
PLANES: dict = {}
_original = None


async def routed_get_data_from_worker(rpc, keys, worker, *, who=None, serializers=None, deserializers=None):
    plane = PLANES.get(who)
    if plane is not None and await plane.reaches(worker):
        response = await plane.fetch(worker, keys)
        if response is not None:
            return response
    return await _original(rpc, keys, worker, who=who, serializers=serializers, deserializers=deserializers)


def install() -> None:
    global _original
    import distributed.worker

    if _original is None:
        _original = distributed.worker.get_data_from_worker
        distributed.worker.get_data_from_worker = routed_get_data_from_worker


def uninstall() -> None:
    """Give distributed its own function back once no plane of this process is left."""
    global _original
    import distributed.worker

    if _original is not None and not PLANES:
        distributed.worker.get_data_from_worker = _original
        _original = None


def counters(dask_worker=None) -> dict | None:
    """This worker's plane's counters (``client.run(counters)``), None without a plane."""
    plane = PLANES.get(getattr(dask_worker, "address", None))
    return None if plane is None else plane.counters.as_dict()
