"""The dask config a spillway cluster's workers run with, whoever starts them: the local
GPU and CPU launchers, a batch script (as ``DASK_`` variables) and MPI ranks."""

from __future__ import annotations

from ..options import Options


def worker_config(options: Options, *, tiered_store: bool) -> dict:
    """dask config for the workers, whoever starts them (local GPU or CPU cluster, a
    batch script, MPI ranks). A transfer option left unset keeps distributed's default.
    With ``tiered_store`` the store bounds its own host bytes, so the process-level
    monitor must not pause or spill a worker whose pinned pool it counts."""
    config = {}
    if options.transfer_connections is not None:
        # distributed bounds fetching by one key and serving by the other: one knob for both
        config["distributed.worker.connections.incoming"] = options.transfer_connections
        config["distributed.worker.connections.outgoing"] = options.transfer_connections
    if options.transfer_message_bytes is not None:
        config["distributed.worker.transfer.message-bytes-limit"] = options.transfer_message_bytes
    if tiered_store:
        config.update({
            "distributed.worker.memory.target": False,
            "distributed.worker.memory.spill": False,
            "distributed.worker.memory.pause": False,
            "distributed.worker.memory.terminate": False,
        })
    return config
