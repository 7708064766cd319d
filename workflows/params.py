"""Workflow parameters: declared once, validated strictly, described as JSON schema.

Jobs arrive as JSON from the CLI, the HTTP service and Slurm scripts, so every value is
checked here (type, range, overflow) before anything is built or allocated, and each
error is one line naming the parameter, the value and the limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from service.errors import ParamError
from service.sizes import format_bytes, parse_size

#: the largest array a parameter may describe: far past any cluster, short of int64 overflow
MAX_ELEMENTS = 2**53
MAX_BYTES = 2**60

DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class Target:
    """What the workflow will run on; defaults and automatic chunks depend on it."""

    kind: str = "cpu"  # "gpu" or "cpu"
    n_workers: int = 1
    #: memory each worker may use before it spills (device memory on GPUs)
    worker_bytes: int = 4 * 2**30
    #: the workers' addresses, where known; inputs larger than one worker are spread over them
    workers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Param:
    name: str
    #: int, float, bool, str, choice, dtype, shape, size, chunks, path
    kind: str
    help: str
    default: Any = None
    #: default on GPU workers, where it differs (GPU defaults use gigabytes)
    gpu_default: Any = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple = ()
    #: a parameter that may be left out (its default is None)
    optional: bool = False

    def default_for(self, target: Target) -> Any:
        if target.kind == "gpu" and self.gpu_default is not None:
            return self.gpu_default
        return self.default

    # --- parsing

    def parse(self, value: Any) -> Any:
        if value is None:
            if self.optional:
                return None
            raise ParamError(f"{self.name}: a value is required")
        parser = getattr(self, f"_parse_{self.kind}")
        return parser(value)

    def _fail(self, value, why: str):
        raise ParamError(f"{self.name}: {value!r} {why}")

    def _range(self, value):
        if self.minimum is not None and value < self.minimum:
            self._fail(value, f"is below the minimum {self.minimum}")
        if self.maximum is not None and value > self.maximum:
            self._fail(value, f"is above the maximum {self.maximum}")
        return value

    def _parse_int(self, value):
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                self._fail(value, "is not an integer")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            self._fail(value, "is not an integer")
        return self._range(value)

    def _parse_float(self, value):
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                self._fail(value, "is not a number")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self._fail(value, "is not a finite number")
        return self._range(float(value))

    def _parse_bool(self, value):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"true", "1", "yes", "on"}:
            return True
        if isinstance(value, str) and value.lower() in {"false", "0", "no", "off"}:
            return False
        self._fail(value, "is not true or false")

    def _parse_str(self, value):
        if not isinstance(value, str):
            self._fail(value, "is not a string")
        return value

    _parse_path = _parse_str

    def _parse_choice(self, value):
        if value not in self.choices:
            self._fail(value, f"is not one of {', '.join(map(str, self.choices))}")
        return value

    def _parse_dtype(self, value):
        if str(value) not in DTYPES:
            self._fail(value, f"is not a supported dtype ({', '.join(DTYPES)})")
        return str(value)

    def _parse_shape(self, value) -> tuple[int, ...]:
        return _parse_dims(self, value)

    def _parse_chunks(self, value):
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        if isinstance(value, str) and _looks_like_bytes(value):
            try:
                return parse_size(value, name=self.name, minimum=1)
            except ValueError as e:
                raise ParamError(str(e)) from None
        return _parse_dims(self, value)

    def _parse_size(self, value):
        """A shape (``40000x40000``, ``[40000, 40000]``) or a total size (``200GB``)."""
        if isinstance(value, str) and _looks_like_bytes(value):
            try:
                nbytes = parse_size(value, name=self.name, minimum=1)
            except ValueError as e:
                raise ParamError(str(e)) from None
            if nbytes > MAX_BYTES:
                self._fail(value, f"exceeds the largest supported size {format_bytes(MAX_BYTES)}")
            return nbytes
        return _parse_dims(self, value)

    # --- description

    def json_schema(self, target: Target | None = None) -> dict:
        dims = {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1}
        types = {
            "int": {"type": "integer"},
            "float": {"type": "number"},
            "bool": {"type": "boolean"},
            "str": {"type": "string"},
            "path": {"type": "string"},
            "choice": {"enum": list(self.choices)},
            "dtype": {"enum": list(DTYPES)},
            "shape": {"oneOf": [dims, {"type": "string", "pattern": r"^\d+(x\d+)*$"}]},
            "size": {
                "oneOf": [
                    dims,
                    {"type": "string", "description": "a shape such as 40000x40000 or bytes such as 200GB"},
                ]
            },
            "chunks": {"oneOf": [dims, {"type": "string"}]},
        }
        schema = dict(types[self.kind])
        schema["description"] = self.help
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        default = self.default_for(target or Target())
        if default is not None:
            schema["default"] = list(default) if isinstance(default, tuple) else default
        if self.optional:
            schema = {"anyOf": [schema, {"type": "null"}], "description": self.help}
        return schema


def _looks_like_bytes(text: str) -> bool:
    text = text.strip().lower()
    return bool(text) and text[-1] == "b" or text.endswith(("kib", "mib", "gib", "tib"))


def _parse_dims(param: Param, value) -> tuple[int, ...]:
    if isinstance(value, str):
        parts = value.lower().replace(",", "x").split("x")
        try:
            dims = [int(p.strip()) for p in parts]
        except ValueError:
            param._fail(value, "is not a shape such as 40000x40000")
    elif isinstance(value, int) and not isinstance(value, bool):
        dims = [value]
    elif isinstance(value, (list, tuple)):
        dims = []
        for d in value:
            if isinstance(d, bool) or not isinstance(d, int):
                param._fail(value, "is not a list of integers")
            dims.append(d)
    else:
        param._fail(value, "is not a shape")
    if not dims or any(d < 1 for d in dims):
        param._fail(value, "must have dimensions >= 1")
    if math.prod(dims) > MAX_ELEMENTS:
        param._fail(value, f"has more than {MAX_ELEMENTS} elements")
    return tuple(dims)


@dataclass(frozen=True)
class Params(Mapping):
    """Validated parameters of one workflow run (read-only)."""

    values: Mapping[str, Any] = field(default_factory=dict)
    #: arrays handed over from Python (dask, CuPy, NumPy, CUDA array interface, DLPack),
    #: by input name; they never appear in the JSON form of the parameters
    arrays: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "values", MappingProxyType(dict(self.values)))
        object.__setattr__(self, "arrays", MappingProxyType(dict(self.arrays)))

    def __getitem__(self, key):
        return self.values[key]

    def __iter__(self):
        return iter(self.values)

    def __len__(self):
        return len(self.values)

    def __getattr__(self, key):
        try:
            return self.values[key]
        except KeyError:
            raise AttributeError(key) from None

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.values.items()}
