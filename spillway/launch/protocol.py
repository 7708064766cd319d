"""The one decision of the transport: what ``protocol: auto`` (and an explicit choice)
comes to for a set of workers."""

from __future__ import annotations

from spillway.options.errors import OptionsError

#: why an ``auto`` cluster of several GPU workers talks TCP
NO_UCXX_NOTE = ("protocol: TCP between GPU workers because distributed-ucxx is not installed "
                "(chunks are staged through host memory; install spillway[cuda13] for NVLink)")


def choose_protocol(requested: str, *, gpu: bool, n_workers: int, have_ucxx: bool) -> tuple[str, str | None]:
    """``(protocol, note)``: ``auto`` is UCX between several GPU workers where
    distributed-ucxx is installed, TCP otherwise (with a note saying why, where UCX was
    the better choice); an explicit ``ucx`` without distributed-ucxx is refused.

    ``have_ucxx`` is whether the *workers' machines* have distributed-ucxx: the local plan
    looks in this process's environment; a batch script or an MPI launch decides on a
    submit host or on rank 0 for nodes it cannot look at, and passes True, since the GPU
    extras always install distributed-ucxx there."""
    if requested == "ucx":
        if not have_ucxx:
            fix = "; install spillway[cuda13] or use protocol tcp" if gpu else ""
            raise OptionsError(f"protocol: ucx requested but distributed-ucxx is not installed{fix}")
        return "ucx", None
    if requested == "tcp" or not gpu or n_workers <= 1:
        return "tcp", None
    if have_ucxx:
        return "ucx", None
    return "tcp", NO_UCXX_NOTE
