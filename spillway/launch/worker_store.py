"""The tiered store a GPU worker is built with, whoever starts it (the local GPU cluster,
``spillway worker`` in a batch job, an MPI rank), and the order of the worker's set-up.

distributed builds a worker's ``data`` in ``Worker.__init__``, before the worker opens
its comms. Over UCX, distributed-ucxx then starts UCX (once per process) when the worker
listens: it creates the worker's CUDA context itself, on the worker's GPU, and warns "A
CUDA context for device N already exists" when one is there already. The tiered store
makes one (its copy streams, the pinned arena's ``cudaHostAlloc``), so it used to win that
race on every start. :func:`build_store` starts UCX first, then builds the store; the
listener later finds UCX started and does nothing.
"""

from __future__ import annotations


def setup_steps(protocol: str) -> tuple[str, ...]:
    """What :func:`build_store` does, in order: ``comm`` (start UCX, which makes the CUDA
    context) before ``store`` over UCX; the store alone over TCP, where no comm cares
    whether a context exists."""
    scheme = protocol.split("://", 1)[0].lower()
    return ("comm", "store") if scheme in ("ucx", "ucxx") else ("store",)


def start_ucx() -> None:
    """Start UCX in this worker process as its listener would (once per process, reading
    the same dask config: :func:`~..upstream.start_ucx`)."""
    from .. import upstream

    upstream.start_ucx()


def tiered_store(**kwargs):
    """The ``store`` step: the worker's tiered store (:mod:`..memory.worker`, imported
    here, in the worker process, not where the worker's keywords are made)."""
    from ..memory.worker import gpu_worker_store

    return gpu_worker_store(**kwargs)


def build_store(*, worker_local_directory: str, protocol: str, **store):
    """The worker's ``data``: runs in the worker process while distributed builds it. The
    modules the worker's first requests need are imported on a thread from here on
    (:mod:`.warm_imports`), while the worker registers and the cluster starts."""
    from . import warm_imports

    built = None
    for step in setup_steps(protocol):
        if step == "comm":
            start_ucx()
        else:
            built = tiered_store(worker_local_directory=worker_local_directory, **store)
    warm_imports.start(warm_imports.WORKER)
    return built
