"""The one options object that owns every cluster setting and its validation.

Every entry point (CLI, Python API, HTTP service, Slurm renderer, benchmarks) builds an
:class:`Options` through :meth:`Options.resolve` and passes it on by keyword; nothing else
re-declares a setting. Values are layered, each source overriding the one before:

1. the defaults in ``spillway/options/config.yaml`` (dask-config namespace ``spillway``),
2. dask config files and ``dask.config.set`` (the same namespace),
3. ``DASK_SPILLWAY__<KEY>`` environment variables,
4. CLI flags,
5. Python keywords.

Each option is declared once, as a field of :class:`Options` made by :func:`option`: its
default, its parser (which checks the value and carries the JSON schema of what it takes),
its help and whether ``spillway worker`` gets it as a flag. :data:`OPTIONS` lists those
declarations; the CLI flags (:mod:`spillway.cli.options`), the flags of a batch
job's workers (:mod:`spillway.launch.commands`) and, through ``python -m
spillway.options.docs --write``, ``config.yaml``, ``config_schema.yaml`` and the
README's table are made from it.

Every value, whichever source gave it, goes through its parser in ``__post_init__``: that
is the run-time check of the user's config (a bad value from a dask config file or a
``DASK_SPILLWAY__`` variable fails there, naming the key, the value, what is allowed and
where it came from). The JSON schema is generated from the same parsers for editors and
docs, and is not checked again at run time: it would repeat the parsers' checks, and it
cannot take all they accept (dask reads ``DASK_SPILLWAY__DEVICES=0,1`` as the tuple
``(0, 1)`` and ``DASK_SPILLWAY__NVLINK=off`` as a string).

Validation needs no GPU: what depends on the machine (does device 3 exist, are there
enough GPUs for the workers) is checked by :mod:`spillway.launch.plan` against the GPU
inventory, still before anything starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dask.config
import yaml

from .errors import OptionsError
from .sizes import parse_size, parse_size_or_fraction

NAMESPACE = "spillway"
#: the RMM pool ``rmm-pool-size: auto`` takes, as a fraction of each GPU
AUTO_POOL_FRACTION = 0.9
#: most worker processes on one GPU: each holds a CUDA context (about half a GB) and
#: shares the GPU's memory, so beyond a few the shares get too small to be useful
MAX_WORKERS_PER_GPU = 8
DEFAULTS_FILE = Path(__file__).with_name("config.yaml")


def load_defaults() -> dict[str, Any]:
    """The packaged defaults, keyed by their config (hyphenated) names."""
    with DEFAULTS_FILE.open() as f:
        return yaml.safe_load(f)[NAMESPACE]


# Registering the defaults lets `dask.config.get("spillway.…")` work everywhere, workers
# included, without each caller reading the YAML.
dask.config.update_defaults({NAMESPACE: load_defaults()})


def _key(attr: str) -> str:
    return attr.replace("_", "-")


# --- value parsers: each takes the raw value and the config key, returns the clean value,
# and carries (``.schema``) the JSON schema of the values a config file may give it


def _allows(**schema):
    """Marks a parser with the JSON schema of what it takes, for the generated
    ``config_schema.yaml``; its bounds are the parser's own arguments, so the schema and
    the check cannot disagree."""

    def mark(parse):
        parse.schema = schema
        return parse

    return mark


def _types(schema: dict) -> list[str]:
    types = schema["type"]
    return list(types) if isinstance(types, list) else [types]


@_allows(type="boolean")
def _bool(value, key):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in {"1", "true", "yes", "on"}:
        return True
    if isinstance(value, str) and value.strip().lower() in {"0", "false", "no", "off"}:
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise OptionsError(f"{key}: expected true or false, got {value!r}")


def _fraction(value, key):
    try:
        number = float(value.strip()) if isinstance(value, str) else value
    except ValueError:
        raise OptionsError(f"{key}: expected a number from 0 to 1, got {value!r}") from None
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not 0 <= number <= 1:
        raise OptionsError(f"{key}: expected a number from 0 to 1, got {value!r}")
    return float(number)


_fraction.schema = {"type": "number", "minimum": 0, "maximum": 1}


def _int(minimum: int, maximum: int | None = None):
    @_allows(type="integer", minimum=minimum, **({} if maximum is None else {"maximum": maximum}))
    def parse(value, key):
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise OptionsError(f"{key}: expected an integer, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise OptionsError(f"{key}: expected an integer, got {value!r}")
        if value < minimum or (maximum is not None and value > maximum):
            limit = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise OptionsError(f"{key}: {value} must be {limit}")
        return value

    return parse


def _optional(parse):
    def wrapped(value, key):
        if value is None or (isinstance(value, str) and value.strip().lower() in {"", "none", "null"}):
            return None
        return parse(value, key)

    wrapped.schema = {**parse.schema, "type": [*_types(parse.schema), "null"]}
    return wrapped


@_allows(type=["string", "number"])
def _size_or_fraction(value, key):
    try:
        return parse_size_or_fraction(value, name=key)
    except ValueError as e:
        raise OptionsError(str(e)) from None


def _limit(*words: str):
    """A size, a fraction, 0 (no limit) or one of ``words`` (such as ``auto``)."""

    @_allows(type=["string", "number"])
    def parse(value, key):
        if isinstance(value, str) and value.strip().lower() in words:
            return value.strip().lower()
        if value == 0 or (isinstance(value, str) and value.strip() in {"0", "0B"}):
            return 0
        if value is None:
            return 0
        try:
            return parse_size_or_fraction(value, name=key)
        except ValueError as e:
            choices = f"one of {', '.join(words)}, or " if words else ""
            raise OptionsError(f"{e} (or {choices}0 for none)") from None

    return parse


def _bytes_limit(*words: str):
    """Like :func:`_limit`, bytes only: a fraction is refused."""
    limit = _limit(*words)

    @_allows(type=["string", "integer"])
    def parse(value, key):
        value = limit(value, key)
        if isinstance(value, float):
            raise OptionsError(f"{key}: {value!r} must be bytes (such as 32GB), not a fraction")
        return value

    return parse


def _auto_or(parse):
    def wrapped(value, key):
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        return parse(value, key)

    types = _types(parse.schema)
    wrapped.schema = {**parse.schema, "type": types if "string" in types else ["string", *types]}
    return wrapped


@_allows(type="string")
def _str(value, key):
    if not isinstance(value, str):
        raise OptionsError(f"{key}: expected a string, got {value!r}")
    return value


def _choice(*choices: str):
    @_allows(type="string", enum=list(choices))
    def parse(value, key):
        if not isinstance(value, str) or value.strip().lower() not in choices:
            raise OptionsError(f"{key}: {value!r} is not one of {', '.join(choices)}")
        return value.strip().lower()

    return parse


@_allows(type=["string", "integer", "array"], items={"type": ["integer", "string"]})
def _devices(value, key):
    """``all`` (None), or a tuple of GPU indices (int) and UUIDs (str)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in {"all", ""}):
        return None
    items = value.split(",") if isinstance(value, str) else value
    if isinstance(items, int):
        items = [items]
    out = []
    for item in items:
        if isinstance(item, bool):
            raise OptionsError(f"{key}: {item!r} is neither a GPU index nor a UUID")
        if isinstance(item, int):
            index = item
        else:
            text = str(item).strip()
            if text.isdigit():
                index = int(text)
            elif text.startswith(("GPU-", "MIG-")) and len(text) > 4:
                out.append(text)
                continue
            else:
                raise OptionsError(
                    f"{key}: {text!r} is neither a GPU index nor a UUID (GPU-...); use all, 0,1 or UUIDs"
                )
        if index < 0:
            raise OptionsError(f"{key}: GPU index {index} must be >= 0")
        out.append(index)
    if not out:
        raise OptionsError(f"{key}: {value!r} names no GPU")
    if len(set(out)) != len(out):
        raise OptionsError(f"{key}: {value!r} names a GPU twice")
    return tuple(out)


@_allows(type=["string", "integer"])
def _bytes(value, key):
    """A whole number of bytes (``1GB``, ``64MiB``, 1000000), at least one."""
    try:
        return parse_size(value, name=key, minimum=1)
    except ValueError as e:
        raise OptionsError(str(e)) from None


def _bytes_at_least(minimum: int):
    @_allows(type=["string", "integer"])
    def parse(value, key):
        try:
            return parse_size(value, name=key, minimum=minimum)
        except ValueError as e:
            raise OptionsError(str(e)) from None

    return parse


@_allows(type="string")
def _directory(value, key):
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise OptionsError(f"{key}: expected a directory path, got {value!r}")
    return str(Path(value).expanduser())


@_allows(type="string")
def _existing_file(value, key):
    path = Path(str(value)).expanduser()
    if not path.is_file():
        raise OptionsError(f"{key}: file {str(path)!r} does not exist")
    return str(path)




def _devices_text(devices: tuple[int | str, ...] | None) -> str:
    """``devices`` as config files and flags write it."""
    return "all" if devices is None else ",".join(map(str, devices))


# --- the declarations


def option(default, parse: Callable[[Any, str], Any], *, help: str, worker: bool = False, gpu: bool = False,
           common: bool = False, config_form: Callable[[Any], Any] | None = None):
    """Declares an option as a field of :class:`Options`: its ``default`` (as the options
    object holds it), the parser that reads and checks its values (and carries their JSON
    schema), its ``help`` (the CLI flag's, the schema's description, the README's), whether
    a node's GPU workers are built from it (``worker``: ``spillway worker`` then gets it as a
    flag), whether only GPU workers use it (``gpu``: CPU workers leave it aside, and say so
    where it was set), whether it is one of the few people change (``common``: shown in
    the short help of ``spillway run``, ``up`` and ``serve``, the others accepted there but
    listed by ``spillway config --help`` only) and, where the parsed value is not how
    config files write it, ``config_form``."""
    return field(default=default, metadata={"option": dict(parse=parse, help=help, worker=worker, gpu=gpu,
                                                           common=common, config_form=config_form)})


@dataclass(frozen=True)
class Option:
    """One option as declared on :class:`Options` (see :func:`option`), and the names it
    goes by."""

    #: the attribute and keyword, ``rmm_pool_size``
    name: str
    default: Any
    parse: Callable[[Any, str], Any]
    help: str
    worker: bool = False
    #: only GPU workers use it
    gpu: bool = False
    #: shown in the commands' short help
    common: bool = False
    config_form: Callable[[Any], Any] | None = None

    @property
    def key(self) -> str:
        """The config key, ``rmm-pool-size``, as config files and error messages name it."""
        return _key(self.name)

    @property
    def flag(self) -> str:
        return f"--{self.key}"

    @property
    def env(self) -> str:
        return f"DASK_SPILLWAY__{self.name.upper()}"

    @property
    def switch(self) -> bool:
        """True for a boolean, whose flags are ``--key/--no-key``; others take a value."""
        return self.parse is _bool

    def as_config(self, value):
        """A parsed value as config files write it."""
        return value if self.config_form is None else self.config_form(value)

    @property
    def config_default(self):
        return self.as_config(self.default)

    @property
    def schema(self) -> dict[str, Any]:
        """The JSON schema of the key's values: the help, the parser's schema, the default."""
        return {"description": self.help, **self.parse.schema, "default": self.config_default}


class RmmAndTls:
    """What :class:`Options` and a worker's spec
    (:class:`~spillway.launch.spec.WorkerSpec`) derive alike from the fields both
    hold: the RMM pool (``pool_size``, resolved), managed memory, the async allocator, and
    the TLS files. Defined once here so the two cannot come to disagree."""

    @property
    def uses_rmm(self) -> bool:
        """Whether workers allocate through an RMM resource (CuPy is then pointed at it)."""
        return self.pool_size is not None or self.rmm_managed_memory or self.rmm_async

    @property
    def dask_security(self):
        """distributed ``Security`` for the TLS files, or None."""
        return tls_security(self.tls_ca_file, self.tls_cert, self.tls_key)


@dataclass(frozen=True, kw_only=True)
class Options(RmmAndTls):
    """Every cluster setting, validated. Build it with :meth:`resolve`."""

    devices: tuple[int | str, ...] | None = option(
        None, _devices, config_form=_devices_text, gpu=True, common=True,
        help="GPUs to use, as `all`, or comma-separated indices or UUIDs (`0,1`, `GPU-3f2a...`).")
    n_workers: int | None = option(
        None, _optional(_int(1)), common=True,
        help="Number of workers; null means one per selected GPU (or one per core, at most 4, on "
             "CPU).")
    workers_per_gpu: int = option(
        1, _int(1, MAX_WORKERS_PER_GPU), worker=True, gpu=True, common=True,
        help="Worker processes on each GPU (1 to 8). Each worker gets its share of the GPU "
             "(device memory limit and RMM pool given as fractions) and of the host; workers of "
             "one GPU move chunks over CUDA IPC with UCXX (over TCP, staged through host memory, "
             "without distributed-ucxx). More than one can overlap I/O with compute.")
    threads_per_worker: int = option(
        1, _int(1, 1024), worker=True,
        help="Threads in each worker process.")
    cpu: bool = option(
        False, _bool, common=True,
        help="Run on CPU workers with NumPy chunks even where GPUs are present.")
    rmm_pool_size: int | float | str | None = option(
        "auto", _optional(_auto_or(_size_or_fraction)), worker=True, gpu=True, common=True,
        help="Initial RMM pool size per worker (bytes such as `20GB`, or a fraction of the GPU's "
             "memory); `auto` takes 90% of the GPU unless rmm-async or rmm-managed-memory is set "
             "(a pool keeps CUDA IPC handles cached for NVLink transfers); null for no pool.")
    rmm_maximum_pool_size: int | float | None = option(
        None, _optional(_size_or_fraction), worker=True, gpu=True,
        help="Largest the RMM pool may grow to per worker; needs `rmm-pool-size`. Unset, an "
             "`auto` pool stays at its start size (the rest of the GPU is for CUDA, its libraries "
             "and the client) and a pool of a size given grows as RMM lets it.")
    rmm_managed_memory: bool = option(
        False, _bool, worker=True, gpu=True,
        help="Allocate device memory as CUDA managed memory (pages migrate to the host under "
             "pressure). Not with NVLink.")
    rmm_async: bool = option(
        False, _bool, worker=True, gpu=True,
        help="Use the CUDA asynchronous allocator (cudaMallocAsync) instead of an RMM pool. Not "
             "with managed memory, nor with several GPU workers over NVLink (UCX cannot map its "
             "memory there and would stage every chunk through the host).")
    rmm_release_threshold: int | float | None = option(
        None, _optional(_size_or_fraction), worker=True, gpu=True,
        help="With `rmm-async`, memory above this size held by the allocator is returned to the "
             "driver at synchronisation.")
    rmm_log_directory: str | None = option(
        None, _optional(_directory), worker=True, gpu=True,
        help="Directory for per-worker RMM allocation logs; null for none.")
    rmm_track_allocations: bool = option(
        False, _bool, worker=True, gpu=True,
        help="Wrap each worker's RMM resource in a tracking adaptor so the dashboard shows "
             "allocated bytes (slower).")
    device_memory_limit: int | float | str = option(
        "default", _limit("default", "auto"), worker=True, gpu=True, common=True,
        help="Device bytes a worker may hold before it spills to host (`default` is 80% of the "
             "GPU, a size, a fraction, or 0 for no spilling).")
    memory_limit: int | float | str = option(
        "auto", _limit("auto"), worker=True, common=True,
        help="Host bytes per worker before it spills to disk (`auto` shares the machine's memory "
             "evenly, a size, a fraction, or 0 for no limit).")
    local_directory: str | None = option(
        None, _optional(_directory), worker=True,
        help="Directory for disk spill and worker scratch files; null uses dask's temporary "
             "directory.")
    memory_store: str = option(
        "tiered", _choice("tiered", "dask-cuda"), worker=True, gpu=True,
        help="What holds a GPU worker's chunks, `tiered` (spillway's device -> pinned host -> "
             "disk store, evicting what queued tasks need last; checked against NumPy at 1.5x "
             "the GPUs' memory, see benchmarks/NOTES.md) or `dask-cuda` (dask-cuda's "
             "DeviceHostFile). Every launcher takes it (local, `spillway worker` in Slurm jobs, "
             "MPI ranks); with rmm-managed-memory workers keep dask-cuda's.")
    pinned_pool_size: int | str = option(
        "auto", _bytes_limit("auto"), worker=True, gpu=True,
        help="Pinned host memory each GPU worker takes and touches for spilled chunks, on a "
             "background thread from its start while the worker is idle (spills use it as it "
             "grows; a spill that finds it short makes it grow at once), `auto` (the worker's "
             "share of half the host's memory, at most its memory-limit), a size, or 0 (pinned "
             "buffers taken on demand). The workers of one host may pin at most half its memory "
             "between them; a larger size is refused before anything starts.")
    prefetch: bool = option(
        True, _bool, gpu=True,
        help="With the tiered store, bring the inputs of the next queued tasks back to the "
             "device ahead of use.")
    spill_on_demand: bool = option(
        True, _bool, gpu=True,
        help="With the tiered store, when a device allocation fails, spill chunks no running "
             "task holds and retry instead of failing the task.")
    gc_freeze: bool = option(
        True, _bool,
        help="Keep Python's full garbage collections short in the workers and the scheduler: "
             "once the cluster is ready, and at a quiet moment after a full collection, each "
             "process collects and moves what is alive to the permanent generation "
             "(gc.freeze), so a collection during a run walks only newer objects (a full one "
             "paused a GPU worker 0.10-0.17 s otherwise).")
    protocol: str = option(
        "auto", _choice("auto", "ucx", "tcp"),
        help="Transport between workers, `ucx` (UCXX, NVLink / CUDA IPC), `tcp`, or `auto` (ucx "
             "with more than one GPU and UCXX installed).")
    nvlink: bool = option(
        True, _bool, worker=True, gpu=True,
        help="With ucx, let UCX move GPU buffers over NVLink / CUDA IPC.")
    data_plane: bool = option(
        True, _bool, gpu=True,
        help="Over ucx, move chunks between workers on spillway's data plane: a UCXX endpoint "
             "kept open per pair of workers, one request and its reply per gather, the receiver "
             "allocating from its RMM pool, instead of distributed's per-gather comm protocol "
             "(Dask still chooses what moves where and when). No effect over tcp.")
    collective_group_fraction: float = option(
        0.25, _fraction,
        help="Rechunks run as one collective (a cut a input chunk, an assembly a output chunk). "
             "An exchange whose bytes over the workers are at most this fraction of the smallest "
             "worker's fastest tier (device, else host) is grouped: each cut packs what each worker "
             "assembles into one buffer and every worker takes its buffers in one request per peer; "
             "a larger one keeps each piece a value of its own, which the tiered store spills and "
             "restores one by one. 0 never groups.")
    exchange: str = option(
        "step", _choice("step", "pieces"),
        help="How a rechunk, a transpose's or an FFT's axis swap and map_overlap's halos move "
             "between workers where they fit the workers' fastest tiers: `step`, one task a worker "
             "that cuts its input chunks, sends every peer its pieces over the exchange transport "
             "and joins what it receives (the output chunks are cheap getters of its result); "
             "`pieces`, a cut task a input chunk, a barrier and an assembly task a output chunk "
             "that takes its pieces over the data plane. Read where the graph is built.")
    exchange_transport: str = option(
        "auto", _choice("auto", "ipc", "ucxx", "host"), worker=True,
        help="What an exchange's steps move their buffers over: `ipc` (the workers of one GPU: "
             "each step's one kernel writes its pieces straight into its peers' output chunks, "
             "mapped over CUDA IPC; no buffer, each byte read and written once), `ucxx` (UCXX's "
             "core API on a context of the step's own, outside the worker's event loop: CUDA IPC "
             "between processes of a host, the network between hosts), `host` (a TCP connection "
             "a peer, device buffers staged through host memory), or `auto` (ipc where every "
             "step of the exchange shares one GPU, else ucxx where every worker has UCXX "
             "installed, else host).")
    exchange_round_bytes: int | str = option(
        "auto", _auto_or(_bytes),
        help="Most bytes a worker receives in one round of an exchange's step (its outputs are "
             "joined in rounds, and stored, spillable, between them). `auto`: a quarter of the "
             "smallest worker's fastest tier. Read where the graph is built.")
    transfer_connections: int | None = option(
        None, _optional(_int(1)), worker=True,
        help="Transfers each worker keeps open at once, to fetch chunks and to serve them "
             "(`distributed.worker.connections.incoming` and `.outgoing`, an integer of at least "
             "1); null keeps distributed's defaults (10 and 50).")
    transfer_message_bytes: int | str | None = option(
        "auto", _optional(_auto_or(_bytes)), worker=True,
        help="Most bytes of chunks a worker fetches from one peer in one request "
             "(`distributed.worker.transfer.message-bytes-limit`, a size such as `1GB`; a larger "
             "chunk still goes alone). `auto`: 1 GiB on GPU workers with the data plane, whose "
             "request carries any number of chunks at once (distributed lets a worker fetch from "
             "one peer at a time, so many small chunks otherwise go a request each), distributed's "
             "default (50MB) elsewhere; null keeps distributed's default everywhere.")
    transfer_offload: int | str | None = option(
        "auto", _optional(_auto_or(_bytes)), worker=True,
        help="Size of a message above which a worker (de)serializes it on distributed's offload "
             "thread rather than its event loop (`distributed.comm.offload`, a size such as `1TiB`). "
             "`auto`: never on GPU workers, whose chunks serialize as metadata only (the two thread "
             "hops cost 0.8-1.1 ms of each 16 MiB-1 GiB transfer between two workers of an H100, "
             "benchmarks/NOTES.md), distributed's default on CPU workers; null keeps distributed's "
             "default (10MiB) everywhere.")
    event_loop: str = option(
        "auto", _choice("auto", "asyncio", "uvloop"), worker=True,
        help="Event loop of the workers (`distributed.admin.event-loop`): `uvloop` (needs the "
             "uvloop package on the workers), `asyncio`, or `auto` (distributed's default, asyncio).")
    zarr_decode_threads: int | None = option(
        None, _optional(_int(1, 256)), worker=True,
        help="Threads each worker decodes default (one zstd frame per chunk) Zarr chunks on, "
             "each chunk read and decoded on one thread; null takes the worker's cores, at most 16.")
    zarr_decode_buffer_bytes: int | None = option(
        None, _optional(_bytes), worker=True,
        help="Host bytes each worker may hold in Zarr decode buffers (files read, chunks decoded, "
             "and those kept for reuse); null takes a quarter of the host's memory shared between "
             "its GPUs, at most 24 GiB.")
    zarr_decode_piece_bytes: int = option(
        16 * 2**20, _bytes_at_least(2**16), worker=True,
        help="Bytes of a piece when a default-store Zarr chunk is decoded while it is read: the "
             "file is read, and the chunk decoded and copied to the device, this many bytes at a "
             "time (at least 64 KiB; benchmarks/NOTES.md says how 16 MiB was chosen).")
    interface: str | None = option(
        None, _optional(_str), worker=True,
        help="Network interface the scheduler and workers listen on (such as `ib0`); null for "
             "the host address.")
    host: str = option(
        "127.0.0.1", _str,
        help="Address the scheduler listens on; loopback keeps it private to this machine.")
    scheduler_port: int = option(
        0, _int(0, 65535),
        help="Scheduler port; 0 picks a free one.")
    dashboard_address: str | None = option(
        "127.0.0.1:8787", _optional(_str),
        help="Address of the Dask dashboard; loopback by default because it shows every task "
             "(`:8787` serves it on all interfaces); null or empty turns it off.")
    tls_ca_file: str | None = option(
        None, _optional(_existing_file), worker=True,
        help="CA certificate for TLS between scheduler, workers and clients (all three TLS files "
             "or none).")
    tls_cert: str | None = option(
        None, _optional(_existing_file), worker=True,
        help="Certificate for TLS.")
    tls_key: str | None = option(
        None, _optional(_existing_file), worker=True,
        help="Private key for TLS.")
    security: bool = option(
        False, _bool,
        help="TLS between scheduler, workers and clients with a CA and certificate made for this "
             "cluster when it starts (files readable by its owner only, removed when it closes): "
             "a process without them cannot connect. `spillway serve` always does this unless the "
             "TLS files are given. Local clusters only; a Slurm or MPI cluster takes the TLS files.")
    scheduler_address: str | None = option(
        None, _optional(_str), common=True,
        help="Attach to this running scheduler instead of starting a cluster.")
    scheduler_file: str | None = option(
        None, _optional(_str), common=True,
        help="Attach to the scheduler described by this file (written by `spillway up` or a "
             "Slurm job).")
    #: where each value came from: "default", "dask config", "env DASK_SPILLWAY__…",
    #: "flag --…" or "keyword"
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        for o in OPTIONS:
            try:
                value = o.parse(getattr(self, o.name), o.key)
            except OptionsError as e:
                # a value the user did not type here: say where it was set
                source = self.sources.get(o.name, "default")
                if source == "dask config" or source.startswith("env "):
                    raise OptionsError(f"{e} (from {source})") from None
                raise
            object.__setattr__(self, o.name, value)
        self._check_combinations()

    def _check_combinations(self):
        ucx_nvlink = self.nvlink and self.protocol != "tcp" and not self.cpu
        if self.rmm_managed_memory and ucx_nvlink:
            raise OptionsError(
                "rmm-managed-memory: managed memory cannot be used with NVLink "
                f"(protocol={self.protocol}, nvlink=true); set nvlink false or protocol tcp"
            )
        if self.rmm_async and self.rmm_managed_memory:
            raise OptionsError("rmm-async: the async allocator cannot be combined with rmm-managed-memory")
        if self.rmm_async and self.rmm_pool_size not in (None, "auto"):
            raise OptionsError(
                f"rmm-pool-size: {self.rmm_pool_size!r} is not used with rmm-async "
                "(the async allocator has its own pool); unset one of them"
            )
        if self.rmm_release_threshold is not None and not self.rmm_async:
            raise OptionsError(
                f"rmm-release-threshold: {self.rmm_release_threshold!r} needs rmm-async true"
            )
        if self.rmm_maximum_pool_size is not None and self.rmm_pool_size is None:
            raise OptionsError(
                f"rmm-maximum-pool-size: {self.rmm_maximum_pool_size!r} needs rmm-pool-size"
            )
        if (
            self.rmm_maximum_pool_size is not None
            and self.rmm_pool_size != "auto"
            and type(self.rmm_pool_size) is type(self.rmm_maximum_pool_size)
            and self.rmm_maximum_pool_size < self.rmm_pool_size
        ):
            raise OptionsError(
                f"rmm-maximum-pool-size: {self.rmm_maximum_pool_size!r} is smaller than "
                f"rmm-pool-size {self.rmm_pool_size!r}"
            )
        tls = [self.tls_ca_file, self.tls_cert, self.tls_key]
        if any(tls) and not all(tls):
            raise OptionsError("tls-ca-file, tls-cert, tls-key: give all three TLS files or none")
        if self.security and self.tls_ca_file:
            raise OptionsError("security: true makes a certificate for the cluster; it does not go with "
                               "tls-ca-file, tls-cert and tls-key (which are already one)")
        if self.scheduler_address and self.scheduler_file:
            raise OptionsError(
                f"scheduler-address: {self.scheduler_address!r} and scheduler-file "
                f"{self.scheduler_file!r} both name a scheduler; give one"
            )
        if self.cpu and self.workers_per_gpu > 1:
            raise OptionsError(f"workers-per-gpu: {self.workers_per_gpu} places workers on GPUs but cpu is true")
        if self.cpu and self.devices is not None:
            raise OptionsError(f"devices: {','.join(map(str, self.devices))} selects GPUs but cpu is true")

    # --- derived views

    @property
    def pool_size(self) -> int | float | None:
        """The RMM pool to create: ``auto`` is 90% of the GPU unless another allocator
        (async, managed) was chosen."""
        if self.rmm_pool_size != "auto":
            return self.rmm_pool_size
        return None if (self.rmm_async or self.rmm_managed_memory) else AUTO_POOL_FRACTION

    @property
    def maximum_pool_size(self) -> int | float | None:
        """The largest the RMM pool may grow to: as set, else the ``auto`` pool's own size.

        An ``auto`` pool left to grow took the last 10% of the GPU in a run past its memory
        (two H200s, an FFT at 1.5x their memory): the client process on that GPU could then
        not create the CUDA stream UCX copies a result with, and the gather of the run's
        answer failed and was retried for minutes. Capped, an allocation past the pool
        spills on demand instead, and CUDA, cuFFT's plans, UCX and the client keep room."""
        if self.rmm_maximum_pool_size is not None or self.rmm_pool_size != "auto":
            return self.rmm_maximum_pool_size
        return self.pool_size

    @property
    def attach(self) -> bool:
        """True when the options name a running scheduler instead of a new cluster."""
        return bool(self.scheduler_address or self.scheduler_file)

    def as_config(self) -> dict[str, Any]:
        """The settings as a ``spillway`` config mapping (hyphenated keys)."""
        return {o.key: o.as_config(getattr(self, o.name)) for o in OPTIONS}

    def replace(self, **changes) -> Options:
        """A copy with ``changes`` applied (and validated); their source is "keyword"."""
        sources = dict(self.sources)
        sources.update({k: "keyword" for k in changes})
        return dataclasses.replace(self, sources=sources, **changes)

    # --- construction from the layered sources

    @classmethod
    def resolve(cls, flags: Mapping[str, Any] | None = None, /, **keywords) -> Options:
        """Options from defaults, dask config, environment, ``flags`` and ``keywords``.

        ``flags`` maps attribute names to CLI values; None means the flag was not given.
        """
        known = set(fields())
        defaults = {_attr(k): v for k, v in load_defaults().items()}
        values: dict[str, Any] = dict(defaults)
        sources = {k: "default" for k in values}

        configured = dask.config.get(NAMESPACE, default={}) or {}
        _check_keys(configured, "dask config")
        for k, v in configured.items():
            attr = _attr(k)
            if v != defaults.get(attr):
                values[attr], sources[attr] = v, "dask config"

        env = dask.config.collect_env(dict(os.environ)).get(NAMESPACE, {}) or {}
        _check_keys(env, "environment")
        for k, v in env.items():
            attr = _attr(k)
            values[attr], sources[attr] = v, f"env {DECLARED[attr].env}"

        for k, v in (flags or {}).items():
            if k not in known:
                raise OptionsError(f"{k}: not a spillway option")
            if v is not None:
                values[k], sources[k] = v, f"flag {DECLARED[k].flag}"

        for k, v in keywords.items():
            if k not in known:
                hint = difflib.get_close_matches(k, known, n=1)
                raise OptionsError(
                    f"{k}: not a spillway option" + (f" (did you mean {hint[0]}?)" if hint else "")
                )
            values[k], sources[k] = v, "keyword"

        return cls(sources=sources, **values)


def _attr(key: str) -> str:
    return key.replace("-", "_")


def _check_keys(mapping: Mapping[str, Any], where: str):
    if not isinstance(mapping, Mapping):
        raise OptionsError(f"{NAMESPACE} ({where}): expected a mapping of options, got {mapping!r}")
    known = set(fields())
    for k in mapping:
        if _attr(k) not in known:
            hint = difflib.get_close_matches(_attr(k), known, n=1)
            raise OptionsError(
                f"spillway.{k} ({where}): not a spillway option"
                + (f" (did you mean {_key(hint[0])}?)" if hint else "")
            )


#: every option, in declaration order
OPTIONS: tuple[Option, ...] = tuple(
    Option(name=f.name, default=f.default, **f.metadata["option"])
    for f in dataclasses.fields(Options) if "option" in f.metadata
)
#: the declarations by attribute name
DECLARED: Mapping[str, Option] = {o.name: o for o in OPTIONS}


def fields() -> tuple[str, ...]:
    """The option names, in declaration order (``sources`` excluded)."""
    return tuple(DECLARED)


def tls_security(ca_file: str | None, cert: str | None, key: str | None):
    """distributed ``Security`` requiring TLS with one certificate for every role (a local
    cluster starts its scheduler with the same files as its workers and client), or None
    without a CA file."""
    if not ca_file:
        return None
    from distributed.security import Security

    return Security(tls_ca_file=ca_file, tls_client_cert=cert, tls_client_key=key,
                    tls_scheduler_cert=cert, tls_scheduler_key=key,
                    tls_worker_cert=cert, tls_worker_key=key, require_encryption=True)


def worker_value(name: str):
    """The value of option ``name`` in this process's dask config, checked by its parser: what
    a worker's own code reads of the options its launcher set (:func:`~spillway.launch.
    worker_config.worker_config` hands them to every worker), and what a client building a
    graph reads of its own config (the exchange's way and rounds); the default elsewhere."""
    declared = DECLARED[name]
    return declared.parse(dask.config.get(f"{NAMESPACE}.{declared.key}", default=declared.default), declared.key)
