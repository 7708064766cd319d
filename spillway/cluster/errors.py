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
    """An output that was not written as asked: the path and the OS error, in one line."""

    exit_code = 1


class WorkerLost(SpillwayError):
    """A run that failed with workers lost: which ones, and why where the nanny said."""

    exit_code = 1
