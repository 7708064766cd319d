"""What this process decoded, read in one call: the counters (:mod:`.counters`) and the
host-decode pool's buffers. Users read them on every worker through
:func:`spillway.run.measuring.decode_counters` (the bench and the climatology example do)."""

from __future__ import annotations

from .counters import snapshot
from .host_decode import buffer_counts


def decode_counters(dask_worker=None) -> dict:
    """Bytes decoded, frames and seconds spent decoding zstd, on the GPU (nvCOMP, until
    its stream finished) and on the host, since this process started; the host path's
    stages (``read``, ``decode``, ``copy``: bytes, thread-seconds, calls) and its decode
    buffers (``host_buffers``: budget, in use, kept, peak, allocated bytes, threads)."""
    return {**snapshot(), "host_buffers": buffer_counts()}
