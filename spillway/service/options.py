"""The one options object that owns every cluster setting and its validation.

Every entry point (CLI, Python API, HTTP service, Slurm renderer, benchmarks) builds an
:class:`Options` through :meth:`Options.resolve` and passes it on by keyword; nothing else
re-declares a setting. Values are layered, each source overriding the one before:

1. the defaults in ``spillway/service/config.yaml`` (dask-config namespace ``spillway``),
2. dask config files and ``dask.config.set`` (the same namespace),
3. ``DASK_SPILLWAY__<KEY>`` environment variables,
4. CLI flags,
5. Python keywords.

Validation needs no GPU: what depends on the machine (does device 3 exist, are there
enough GPUs for the workers) is checked by :mod:`spillway.service.launch.plan` against the GPU
inventory, still before anything starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
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
SCHEMA_FILE = Path(__file__).with_name("config_schema.yaml")


def load_defaults() -> dict[str, Any]:
    """The packaged defaults, keyed by their config (hyphenated) names."""
    with DEFAULTS_FILE.open() as f:
        return yaml.safe_load(f)[NAMESPACE]


def load_schema() -> dict[str, Any]:
    with SCHEMA_FILE.open() as f:
        return yaml.safe_load(f)


# Registering the defaults lets `dask.config.get("spillway.…")` work everywhere, workers
# included, without each caller reading the YAML.
dask.config.update_defaults({NAMESPACE: load_defaults()})


def _key(attr: str) -> str:
    return attr.replace("_", "-")


# --- value parsers: each takes the raw value and the config key, returns the clean value


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


def _int(minimum: int, maximum: int | None = None):
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

    return wrapped


def _size_or_fraction(value, key):
    try:
        return parse_size_or_fraction(value, name=key)
    except ValueError as e:
        raise OptionsError(str(e)) from None


def _limit(*words: str):
    """A size, a fraction, 0 (no limit) or one of ``words`` (such as ``auto``)."""

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


def _auto_or(parse):
    def wrapped(value, key):
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        return parse(value, key)

    return wrapped


def _str(value, key):
    if not isinstance(value, str):
        raise OptionsError(f"{key}: expected a string, got {value!r}")
    return value


def _choice(*choices: str):
    def parse(value, key):
        if not isinstance(value, str) or value.strip().lower() not in choices:
            raise OptionsError(f"{key}: {value!r} is not one of {', '.join(choices)}")
        return value.strip().lower()

    return parse


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


def _bytes(value, key):
    """A whole number of bytes (``1GB``, ``64MiB``, 1000000), at least one."""
    try:
        return parse_size(value, name=key, minimum=1)
    except ValueError as e:
        raise OptionsError(str(e)) from None


def _directory(value, key):
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise OptionsError(f"{key}: expected a directory path, got {value!r}")
    return str(Path(value).expanduser())


def _existing_file(value, key):
    path = Path(str(value)).expanduser()
    if not path.is_file():
        raise OptionsError(f"{key}: file {str(path)!r} does not exist")
    return str(path)


_PARSERS = {
    "devices": _devices,
    "n_workers": _optional(_int(1)),
    "workers_per_gpu": _int(1, MAX_WORKERS_PER_GPU),
    "threads_per_worker": _int(1, 1024),
    "cpu": _bool,
    "rmm_pool_size": _optional(_auto_or(_size_or_fraction)),
    "rmm_maximum_pool_size": _optional(_size_or_fraction),
    "rmm_managed_memory": _bool,
    "rmm_async": _bool,
    "rmm_release_threshold": _optional(_size_or_fraction),
    "rmm_log_directory": _optional(_directory),
    "rmm_track_allocations": _bool,
    "device_memory_limit": _limit("default", "auto"),
    "memory_limit": _limit("auto"),
    "local_directory": _optional(_directory),
    "memory_store": _choice("tiered", "dask-cuda"),
    "pinned_pool_size": _limit("auto"),
    "prefetch": _bool,
    "spill_on_demand": _bool,
    "protocol": _choice("auto", "ucx", "tcp"),
    "nvlink": _bool,
    "transfer_connections": _optional(_int(1)),
    "transfer_message_bytes": _optional(_bytes),
    "transfer_offload": _optional(_bytes),
    "interface": _optional(_str),
    "host": _str,
    "scheduler_port": _int(0, 65535),
    "dashboard_address": _optional(_str),
    "tls_ca_file": _optional(_existing_file),
    "tls_cert": _optional(_existing_file),
    "tls_key": _optional(_existing_file),
    "scheduler_address": _optional(_str),
    "scheduler_file": _optional(_str),
}


class RmmAndTls:
    """What :class:`Options` and a worker's spec
    (:class:`~spillway.service.launch.spec.WorkerSpec`) derive alike from the fields both
    hold: the RMM pool (``pool_size``, resolved), managed memory, the async allocator, and
    the TLS files. Defined once here so the two cannot come to disagree."""

    @property
    def uses_rmm(self) -> bool:
        """Whether workers allocate through an RMM resource (CuPy is then pointed at it)."""
        return self.pool_size is not None or self.rmm_managed_memory or self.rmm_async

    @property
    def security(self):
        """distributed ``Security`` for the TLS files, or None."""
        return tls_security(self.tls_ca_file, self.tls_cert, self.tls_key)


@dataclass(frozen=True, kw_only=True)
class Options(RmmAndTls):
    """Every cluster setting, validated. Build it with :meth:`resolve`."""

    devices: tuple[int | str, ...] | None = None
    n_workers: int | None = None
    workers_per_gpu: int = 1
    threads_per_worker: int = 1
    cpu: bool = False
    rmm_pool_size: int | float | str | None = "auto"
    rmm_maximum_pool_size: int | float | None = None
    rmm_managed_memory: bool = False
    rmm_async: bool = False
    rmm_release_threshold: int | float | None = None
    rmm_log_directory: str | None = None
    rmm_track_allocations: bool = False
    device_memory_limit: int | float | str = "default"
    memory_limit: int | float | str = "auto"
    local_directory: str | None = None
    memory_store: str = "tiered"
    pinned_pool_size: int | float | str = "auto"
    prefetch: bool = True
    spill_on_demand: bool = True
    protocol: str = "auto"
    nvlink: bool = True
    transfer_connections: int | None = None
    transfer_message_bytes: int | None = None
    transfer_offload: int | None = None
    interface: str | None = None
    host: str = "127.0.0.1"
    scheduler_port: int = 0
    dashboard_address: str | None = "127.0.0.1:8787"
    tls_ca_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    scheduler_address: str | None = None
    scheduler_file: str | None = None
    #: where each value came from: "default", "dask config", "env DASK_SPILLWAY__…",
    #: "flag --…" or "keyword"
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        for f in fields():
            raw = getattr(self, f)
            object.__setattr__(self, f, _PARSERS[f](raw, _key(f)))
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
        if isinstance(self.pinned_pool_size, float):
            raise OptionsError(
                f"pinned-pool-size: {self.pinned_pool_size!r} must be bytes (such as 32GB), not a fraction"
            )
        tls = [self.tls_ca_file, self.tls_cert, self.tls_key]
        if any(tls) and not all(tls):
            raise OptionsError("tls-ca-file, tls-cert, tls-key: give all three TLS files or none")
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
    def attach(self) -> bool:
        """True when the options name a running scheduler instead of a new cluster."""
        return bool(self.scheduler_address or self.scheduler_file)

    def as_config(self) -> dict[str, Any]:
        """The settings as a ``spillway`` config mapping (hyphenated keys)."""
        out = {}
        for f in fields():
            value = getattr(self, f)
            if f == "devices":
                value = "all" if value is None else ",".join(map(str, value))
            out[_key(f)] = value
        return out

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
            values[attr], sources[attr] = v, f"env DASK_SPILLWAY__{attr.upper()}"

        for k, v in (flags or {}).items():
            if k not in known:
                raise OptionsError(f"{k}: not a spillway option")
            if v is not None:
                values[k], sources[k] = v, f"flag --{_key(k)}"

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
    known = set(fields())
    for k in mapping:
        if _attr(k) not in known:
            hint = difflib.get_close_matches(_attr(k), known, n=1)
            raise OptionsError(
                f"spillway.{k} ({where}): not a spillway option"
                + (f" (did you mean {_key(hint[0])}?)" if hint else "")
            )


def fields() -> tuple[str, ...]:
    """The option names, in declaration order (``sources`` excluded)."""
    return tuple(f.name for f in dataclasses.fields(Options) if f.name != "sources")


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
