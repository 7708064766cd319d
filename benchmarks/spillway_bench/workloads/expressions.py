"""The workloads' expressions built directly, the same ones the workflows compute (a
workload uses them where its workflow is not registered or builds something else)."""

from __future__ import annotations

import numpy as np

from spillway.workflows import random
from spillway.workflows.backend import array_module

def transpose_sum(p, backend, seed):
    x = random.uniform(p["shape"], p["chunks"], seed=seed, dtype=p["dtype"], backend=backend)
    return (x + x.T).sum()


def matmul(p, backend, seed):
    x = random.uniform(p["shape"], p["chunks"], seed=seed, stream=0, dtype=p["dtype"], backend=backend)
    y = random.uniform(p["shape"], p["chunks"], seed=seed, stream=1, dtype=p["dtype"], backend=backend)
    return x.dot(y)


def rechunk(p, backend, seed):
    x = random.uniform(p["shape"], p["chunks"], seed=seed, dtype=p["dtype"], backend=backend)
    # P2P rechunking stages shards through host memory and disk; "tasks" keeps chunks
    # on the device and moving between workers, which is what W3 measures
    return x.rechunk(p["to_chunks"], method="tasks")


def rechunk_exchange(p, backend, seed):
    """W3 as spillway runs it: the collective (:mod:`spillway.datapath.collective`)."""
    from spillway.datapath.collective import rechunk as exchange

    x = random.uniform(p["shape"], p["chunks"], seed=seed, dtype=p["dtype"], backend=backend)
    return exchange(x, p["to_chunks"])


def complex_block(seed, shape, location, backend):
    real = random.uniform_block(seed, 0, shape, location, "float64", backend)
    imag = random.uniform_block(seed, 1, shape, location, "float64", backend)
    return real + 1j * imag


def complex_uniform(shape, chunks, *, seed: int, backend: str):
    """A seeded complex128 array as one root layer, so it is persisted as an input."""
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    chunks = da.core.normalize_chunks(chunks, shape, dtype=np.complex128)
    name = "complex-uniform-" + tokenize(seed, shape, chunks, backend)
    offsets = [np.cumsum((0,) + c) for c in chunks]
    layer = {}
    for index in np.ndindex(*[len(c) for c in chunks]):
        location = tuple((int(offsets[d][i]), int(offsets[d][i + 1])) for d, i in enumerate(index))
        layer[(name, *index)] = (complex_block, seed, tuple(shape), location, backend)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=())
    return da.Array(graph, name, chunks, meta=np.empty((0,) * len(shape), dtype=np.complex128))


def fft(p, backend, seed):
    import dask.array as da

    x = complex_uniform(p["shape"], p["chunks"], seed=seed, backend=backend)
    # the transformed axis must be one chunk: gathering it is the all-to-all transfer
    return da.fft.fft(x.rechunk(p["to_chunks"], method="tasks"), axis=0)


def fft_exchange(p, backend, seed):
    """W4 as spillway runs it: the transform axis gathered by the collective."""
    import dask.array as da

    from spillway.datapath.collective import rechunk as exchange

    x = complex_uniform(p["shape"], p["chunks"], seed=seed, backend=backend)
    return da.fft.fft(exchange(x, p["to_chunks"]), axis=0)


def laplacian(block):
    """7-point Laplacian of a block (its one-cell halo is trimmed off afterwards)."""
    xp = array_module("cupy" if type(block).__module__.startswith("cupy") else "numpy")
    out = block * block.dtype.type(-6)
    for axis in range(3):
        lo = [slice(None)] * 3
        hi = [slice(None)] * 3
        lo[axis], hi[axis] = slice(1, None), slice(None, -1)
        out[tuple(lo)] += block[tuple(hi)]
        out[tuple(hi)] += block[tuple(lo)]
    return xp.ascontiguousarray(out)


def stencil(p, backend, seed):
    x = held(random.uniform(p["shape"], p["chunks"], seed=seed, dtype=p["dtype"], backend=backend))
    return x.map_overlap(laplacian, depth=1, boundary=0, dtype=p["dtype"])


def stencil_user(p, backend, seed):
    """O5 as a user writes it: ``map_overlap`` of a 3-D filter (depth 1, zero boundary) on
    a persisted field; on a spillway cluster its halos take the collective's exchange
    where it fits, dask's own tasks elsewhere."""
    x = held(random.uniform(p["shape"], p["chunks"], seed=seed, dtype=p["dtype"], backend=backend))
    return x.map_overlap(laplacian, depth=1, boundary=0, dtype=p["dtype"])


def stencil_dask_halos(p, backend, seed):
    """O5 with dask's own halo tasks on any cluster (its ``tasks_method`` side)."""
    from spillway.datapath.collective.method import dask_halos

    with dask_halos():
        return stencil_user(p, backend, seed)


def total(array):
    return array.sum()

def rechunk_sum_user(p, backend, seed):
    """What a user writes for plain dask-cuda: dask's default rechunk method, which is P2P
    for an all-to-all of this many panels whenever a distributed client is up."""
    x = random.uniform(p["shape"], p["chunks"], seed=seed, dtype=p["dtype"], backend=backend)
    return x.rechunk(p["to_chunks"]).sum()


def rechunk_user(p, backend, seed):
    """O3 as a user writes it: no method, so dask's settings pick it (on a spillway
    cluster a P2P rechunk is routed to the collective)."""
    x = held(random.uniform(p["shape"], p["chunks"], seed=seed, dtype=p["dtype"], backend=backend))
    return x.rechunk(p["to_chunks"])


def fft_user(p, backend, seed):
    """O4 as a user writes it: the transformed axis gathered by a rechunk with no method."""
    import dask.array as da

    x = held(complex_uniform(p["shape"], p["chunks"], seed=seed, backend=backend))
    return da.fft.fft(x.rechunk({0: -1, 1: p["panel"]}), axis=0)


def held(x):
    """``x`` persisted on the default client's cluster where there is one, as a user's
    field is before their code runs: the code's graph is built over it (a rechunk's or
    halos' way is weighed with the field held), not over the field's generation, which
    the bench would persist only after the graph was built (:func:`~spillway_bench.measure.split_inputs`
    waits for it before the clock starts)."""
    try:
        from distributed import default_client

        client = default_client()
    except (ImportError, ValueError):
        return x
    return client.persist(x)


#: the first layer-name prefix found names the rechunk method a graph was built with
RECHUNK_LAYERS = (("spillway-step-", "step"), ("rechunk-exchange-", "collective"), ("rechunk-p2p-", "p2p"),
                  ("rechunk-merge-", "tasks"), ("rechunk-split-", "tasks"))


def rechunk_method(collection) -> str | None:
    """How the rechunk in ``collection`` was built ("step", "collective", "p2p" or "tasks"), read
    off its graph's layer names; None where it has no rechunk."""
    names = list(collection.__dask_graph__().layers)
    for prefix, method in RECHUNK_LAYERS:
        if any(str(n).startswith(prefix) for n in names):
            return method
    return None
