"""The counters of what this process decoded: zstd bytes, frames and seconds, on the GPU
(nvCOMP) and on the host; and, for chunks read through the host (:mod:`.host_decode`),
the bytes and seconds of each stage (file read, decode, copy to the device) summed over
the pool's threads. :func:`.decoded.decode_counters` reads them."""

from __future__ import annotations

import threading

_decoded = {"gpu": [0, 0, 0.0], "host": [0, 0, 0.0]}  # bytes, frames, seconds
#: stage -> [bytes, seconds, calls]; seconds are thread-seconds (several threads at once)
_stages = {"read": [0, 0.0, 0], "decode": [0, 0.0, 0], "copy": [0, 0.0, 0]}
# a worker decodes chunks on several threads at once
_decoded_lock = threading.Lock()


def count(where: str, nbytes: int, frames: int, seconds: float) -> None:
    with _decoded_lock:
        entry = _decoded[where]
        entry[0] += nbytes
        entry[1] += frames
        entry[2] += seconds


def count_stage(stage: str, nbytes: int, seconds: float) -> None:
    with _decoded_lock:
        entry = _stages[stage]
        entry[0] += nbytes
        entry[1] += seconds
        entry[2] += 1


def snapshot() -> dict:
    """The counters now: ``gpu`` and ``host`` (bytes, frames, seconds) and ``stages``."""
    with _decoded_lock:
        out = {k: {"bytes": v[0], "frames": v[1], "seconds": v[2]} for k, v in _decoded.items()}
        out["stages"] = {k: {"bytes": v[0], "seconds": v[1], "calls": v[2]} for k, v in _stages.items()}
    return out
