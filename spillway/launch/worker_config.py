"""The dask config a spillway cluster's workers run with, whoever starts them: the local
GPU and CPU launchers, a batch script (as ``DASK_`` variables) and MPI ranks."""

from __future__ import annotations

from .. import upstream
from spillway.options.settings import DECLARED, Options


#: ``transfer-message-bytes: auto`` on GPU workers with the data plane: one request moves
#: the chunks of a gather at once, so a gather of many small pieces (a rechunk's) costs about
#: what one of its pieces does
PLANE_MESSAGE_BYTES = 2**30
#: ``transfer-offload: auto`` on GPU workers: above every message, so none takes the
#: offload thread (a GPU chunk's frames are device buffers; serializing them is metadata)
GPU_OFFLOAD = 2**40


def worker_config(options: Options, *, tiered_store: bool, gpu: bool = True) -> dict:
    """dask config for the workers, whoever starts them (local GPU or CPU cluster, a
    batch script, MPI ranks; ``gpu``: GPU workers). A transfer option left unset keeps
    distributed's default.
    With ``tiered_store`` the store bounds its own host bytes, so the process-level
    monitor must not pause or spill a worker whose pinned pool it counts."""
    config = {}
    if options.transfer_connections is not None:
        # distributed bounds fetching by one key and serving by the other: one knob for both
        config["distributed.worker.connections.incoming"] = options.transfer_connections
        config["distributed.worker.connections.outgoing"] = options.transfer_connections
    message = options.transfer_message_bytes
    if message == "auto":
        message = PLANE_MESSAGE_BYTES if gpu and options.data_plane else None
    if message is not None:
        config["distributed.worker.transfer.message-bytes-limit"] = message
    offload = options.transfer_offload
    if offload == "auto":
        offload = GPU_OFFLOAD if gpu else None
    if offload is not None:
        # distributed reads it once, when distributed.comm.utils is imported: a worker whose
        # process imported distributed before this config was set follows it through
        # WorkerSetup (follow_offload_config)
        config["distributed.comm.offload"] = offload
    if options.event_loop != "auto":
        # read by the worker process before it makes its loop: a nanny's child after the
        # nanny set this config, a batch or MPI worker from its DASK_ variables or config
        config["distributed.admin.event-loop"] = options.event_loop
    # read on the workers by the Zarr readers and the exchange's steps
    # (spillway.options.settings.worker_value); a worker's own config holds the defaults already
    for name in ("zarr_decode_threads", "zarr_decode_buffer_bytes", "zarr_decode_piece_bytes", "exchange_transport"):
        if getattr(options, name) != DECLARED[name].default:
            config[f"spillway.{name.replace('_', '-')}"] = getattr(options, name)
    if tiered_store:
        config.update({
            "distributed.worker.memory.target": False,
            "distributed.worker.memory.spill": False,
            "distributed.worker.memory.pause": False,
            "distributed.worker.memory.terminate": False,
        })
    return config


def carry_in_spec(cluster, config: dict) -> None:
    """Put ``config`` into ``cluster``'s spec of new workers (a nanny's ``config=``, dotted
    keys as dask-cuda gives its own), so that a worker scale() or adapt() starts later runs
    with it as the first ones did: a nanny hands its worker the config of the moment it
    is built, and the first ones were built inside ``dask.config.set``."""
    options = upstream.new_worker_options(cluster)
    if options is not None:
        options["config"] = {**(options.get("config") or {}), **config}


def follow_offload_config() -> int | bool | None:
    """Make this process's offload threshold (:func:`~..upstream.set_offload_threshold`) follow its dask
    config's ``distributed.comm.offload`` (``transfer-offload``); returns the threshold.

    distributed reads the key once, when ``distributed.comm.utils`` is imported; a worker
    process imports distributed before its nanny hands it the cluster's config (an MPI rank
    before ``dask.config.set``), so without this the option would reach only the workers of
    a batch script (``DASK_`` variables, read at import). ``to_frames``/``from_frames`` read
    the module's value at each call, so it holds from the next message on. Where the config
    agrees with the module (the option unset), nothing changes."""
    import dask.config

    value = dask.config.get("distributed.comm.offload", default=upstream.offload_threshold())
    return upstream.set_offload_threshold(value)
