"""Errors that reach users as one clear line."""


class SpillwayError(Exception):
    """Base of spillway's user-facing errors: the message is one line that names the bad
    value and the limit it broke."""

    exit_code = 1


class OptionsError(SpillwayError, ValueError):
    """An invalid cluster setting or combination. Raised before anything starts."""

    exit_code = 2


class GpusBusy(OptionsError):
    """A selected GPU's free memory cannot hold its workers' pools: another process holds
    it (a cluster still closing gives it back within seconds)."""


class ParamError(SpillwayError, ValueError):
    """An invalid workflow parameter. Raised before anything is built or allocated."""

    exit_code = 2


class AdmissionError(SpillwayError):
    """A workflow whose projected footprint does not fit the cluster."""

    exit_code = 3


class ClusterStartError(SpillwayError):
    """Workers that did not start, with what their nannies said of them."""

    exit_code = 1


class DeviceMemoryExhausted(MemoryError, SpillwayError):
    """A task's device allocation failed after the worker's store spilled all it could: the
    task fails with the worker, the bytes asked for and each tier's bytes; the worker lives.

    MemoryError comes first among the bases so that the class is built by MemoryError's
    constructor: distributed pickles a task's exception through tblib, which rebuilds it
    with ``cls.__new__(cls, ...)``, and with SpillwayError first that call is refused
    ("MemoryError.__new__(DeviceMemoryExhausted) is not safe") and the client got a plain
    Exception holding the text."""


class SpillDiskFull(MemoryError, SpillwayError):
    """The tiers ran out: a worker's spill disk filled (ENOSPC) while its store made room.
    The task that needed the space fails with one line naming the worker, each tier's bytes
    and the spill directory, and the cluster stops the computations still running (their
    outputs are released; arrays held before stay). MemoryError comes first among the bases
    for the reason :class:`DeviceMemoryExhausted` gives."""

    exit_code = 3


class ServiceError(SpillwayError):
    """The service refused a request; the message is the service's own. Also raised where
    a job's output is not on this machine (:func:`spillway.workflows.outputs.open_output`)."""

    def __init__(self, message: str, *, status: int | None = None):
        super().__init__(message)
        self.status = status


class OutputError(SpillwayError):
    """An output that was not written as asked: the path and the OS error, in one line.
    A store the OS refused (a full disk, a read-only or vanished directory: the user's to
    fix) exits 2 as any bad value does; a store that reads back other values exits 1."""

    exit_code = 1

    def __init__(self, message: str, *, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class StoreWriteError(OSError):
    """A worker's write of an output chunk that the OS refused, raised by the writer in
    place of the OSError (same errno and text). It is an OSError, not a SpillwayError: it
    crosses from the worker to the client as the task's exception. The worker's log leaves
    it out (:mod:`spillway.launch.plugins`): the client says it in one line, and the
    worker's traceback of it came first, in 60 lines."""


class MainGuardMissing(SpillwayError):
    """A script that starts a cluster at its top level, without ``if __name__ ==
    "__main__":``: every worker process imports the script again and would start one too."""

    exit_code = 2


class WorkerLost(SpillwayError):
    """A run that failed with workers lost: which ones, and why where the nanny said."""

    exit_code = 1
