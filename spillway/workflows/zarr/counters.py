"""What this process decoded: zstd bytes, frames and seconds, on the GPU (nvCOMP) and on
the host. The bench and the climatology example read them on every worker with
``client.run(decode_counters)``."""

from __future__ import annotations

import threading

_decoded = {"gpu": [0, 0, 0.0], "host": [0, 0, 0.0]}  # bytes, frames, seconds
# a worker decodes chunks on several task threads at once
_decoded_lock = threading.Lock()


def count(where: str, nbytes: int, frames: int, seconds: float) -> None:
    with _decoded_lock:
        entry = _decoded[where]
        entry[0] += nbytes
        entry[1] += frames
        entry[2] += seconds


def decode_counters(dask_worker=None) -> dict:
    """Bytes decoded, frames and seconds spent decoding zstd, on the GPU (nvCOMP, until
    its stream finished) and on the host, since this process started."""
    with _decoded_lock:
        return {k: {"bytes": v[0], "frames": v[1], "seconds": v[2]} for k, v in _decoded.items()}
