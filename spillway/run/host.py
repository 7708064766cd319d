"""Results brought to the host on the worker that holds them, so a client needs no GPU."""

from __future__ import annotations

import uuid


def to_host(value):
    """``value`` with every device array in it (CuPy, or anything with
    ``__cuda_array_interface__``) copied to a NumPy array; tuples, lists and dicts are
    walked. Runs on the worker, as the last task of what the client gathers."""
    if isinstance(value, tuple):
        return tuple(to_host(v) for v in value)
    if isinstance(value, list):
        return [to_host(v) for v in value]
    if isinstance(value, dict):
        return {k: to_host(v) for k, v in value.items()}
    if type(value).__module__.startswith("cupy") or hasattr(value, "__cuda_array_interface__"):
        get = getattr(value, "get", None)
        if callable(get):
            return get()
        import cupy

        return cupy.asnumpy(value)
    return value


#: key prefix of the tasks that bring results to the host
HOST_TASK = "spillway-to-host"


def on_host(client, future):
    """A future of ``future``'s value brought to the host by :func:`to_host`, on the worker
    that holds it. Submitted after the graph rather than wrapped around it (a delayed over
    the collection): that would rebuild the graph and drop the layers' annotations, such
    as where each generated chunk is placed."""
    return client.submit(to_host, future, key=f"{HOST_TASK}-{uuid.uuid4().hex}", pure=False)
