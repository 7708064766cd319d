"""The settings of one batch job: where and how long it runs, not how the cluster
behaves (that is :class:`spillway.options.settings.Options`).

Every value lands in a directive line or a shell word, so each is checked here and a
bad one stops with one line naming it and its limit, before anything is submitted. The
values are written as Slurm writes them (times, memory sizes, extra options), the one
system behind the seam so far; a batch system renders them into its own directives
(:attr:`spillway.launch.batch.BatchSystem.directive_formats`), the wall time as
``HH:MM:SS``, which every batch system reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from spillway.options.errors import OptionsError

MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 64
#: the shortest wall time: the workers need a lifetime and the job a margin after it
MIN_WALLTIME_S = 120

_TIME = re.compile(
    r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)|(?P<mm>\d+):(?P<ss>\d+)|(?P<minutes>\d+))$"
)
_MEM = re.compile(r"^\d+[KMGT]?$")
#: partition, account, QoS and job names: no spaces, quotes or newlines in a directive
_NAME = re.compile(r"^[A-Za-z0-9_.,+@%:=-]+$")


def parse_walltime(text: str) -> int:
    """Seconds of a Slurm time: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``."""
    match = _TIME.match(str(text).strip())
    if not match:
        raise OptionsError(f"time: {text!r} is not a Slurm time (HH:MM:SS or D-HH:MM:SS)")
    g = {k: int(v) for k, v in match.groupdict().items() if v is not None}
    if "minutes" in g:
        return 60 * g["minutes"]
    if "mm" in g:
        minutes, seconds = g["mm"], g["ss"]
        hours = days = 0
    elif "h" in g:
        days, hours, minutes, seconds = 0, g["h"], g["m"], g["s"]
    else:
        days, hours, minutes, seconds = g["days"], g["dh"], g.get("dm", 0), g.get("ds", 0)
    if minutes > 59 or seconds > 59 or ("days" in g and hours > 23):
        raise OptionsError(f"time: {text!r} has minutes or seconds above 59 (or hours above 23 after a day)")
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def format_walltime(seconds: int) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"


def worker_lifetime(walltime_s: int) -> int:
    """Seconds a worker lives: shorter than the wall time by 10% (1 to 10 minutes), so
    workers retire and hand back their data before the batch system kills the job."""
    margin = min(600, max(60, walltime_s // 10))
    return walltime_s - margin


def _check_name(key: str, value):
    if value is None:
        return None
    if not isinstance(value, str) or not _NAME.match(value):
        raise OptionsError(f"{key}: {value!r} must be one word of letters, digits and _.,+@%:=-")
    return value


def _check_int(key: str, value, minimum: int, maximum: int) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise OptionsError(f"{key}: {value!r} must be an integer in [{minimum}, {maximum}]")
    return value


def _directive(line: str) -> str:
    """``--constraint=h200`` or ``#SBATCH --constraint=h200``, as the option part."""
    text = str(line).strip()
    if text.startswith("#SBATCH"):
        text = text[len("#SBATCH"):].strip()
    if not text.startswith("-") or "\n" in text or "\r" in text:
        raise OptionsError(f"extra directive: {line!r} must be one sbatch option such as --constraint=h200")
    return text


@dataclass(frozen=True, kw_only=True)
class JobSettings:
    """Where and for how long a batch job runs, on any batch system."""

    nodes: int = 1
    #: GPUs on each node, one worker each; 0 with CPU workers (``--cpu``)
    gpus_per_node: int = 0
    #: wall time as Slurm writes it (``HH:MM:SS``, ``D-HH:MM:SS``, ...)
    time: str = "01:00:00"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    job_name: str = "spillway"
    #: CPUs for each node's task (the worker processes); None: on GPU jobs one per worker
    #: thread plus one per worker, on CPU jobs Slurm's default
    cpus_per_task: int | None = None
    #: memory per node as Slurm writes it (``500G``; ``0`` for all of it); None leaves
    #: Slurm's default, often too little room for spilling in a partial-node allocation
    mem: str | None = None
    #: directory of the job's output file; results go to ``spillway-<jobid>/`` in it
    output_dir: str = "."
    #: more sbatch options, one each (``--constraint=h200``, ``--exclusive``)
    extra_directives: tuple[str, ...] = ()
    #: shell lines run before anything starts (``module load cuda``, ``source env/bin/activate``)
    setup: tuple[str, ...] = ()
    #: Python on the nodes with spillway installed
    python: str = "python3"
    #: seconds to wait for the scheduler and every worker to come up
    start_timeout: int = 300
    walltime_s: int = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "nodes", _check_int("nodes", self.nodes, 1, MAX_NODES))
        object.__setattr__(self, "gpus_per_node",
                           _check_int("gpus-per-node", self.gpus_per_node, 0, MAX_GPUS_PER_NODE))
        seconds = parse_walltime(self.time)
        if seconds < MIN_WALLTIME_S:
            raise OptionsError(
                f"time: {self.time} is shorter than the minimum {format_walltime(MIN_WALLTIME_S)} "
                "(workers retire a minute before the wall time)"
            )
        object.__setattr__(self, "walltime_s", seconds)
        for key in ("partition", "account", "qos"):
            _check_name(key, getattr(self, key))
        _check_name("job-name", self.job_name)
        if self.cpus_per_task is not None:
            object.__setattr__(self, "cpus_per_task", _check_int("cpus-per-task", self.cpus_per_task, 1, 4096))
        if self.mem is not None and not _MEM.match(str(self.mem)):
            raise OptionsError(f"mem: {self.mem!r} is not a Slurm memory size (such as 500G, 64000M, or 0 for all)")
        object.__setattr__(self, "extra_directives", tuple(_directive(d) for d in self.extra_directives))
        object.__setattr__(self, "start_timeout", _check_int("start-timeout", self.start_timeout, 10, 86400))
        for line in self.setup:
            if "\n" in line:
                raise OptionsError(f"setup: {line!r} must be one shell line")
        if not str(self.output_dir).strip() or any(c.isspace() for c in str(self.output_dir)):
            raise OptionsError(f"output-dir: {self.output_dir!r} must be a directory path without spaces")

    @property
    def lifetime_s(self) -> int:
        return worker_lifetime(self.walltime_s)
