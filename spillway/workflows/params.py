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

from spillway.options.errors import ParamError
from spillway.options.sizes import MAX_BYTES, format_bytes, parse_size

#: the largest array a parameter may describe: far past any cluster, short of int64 overflow
MAX_ELEMENTS = 2**53
#: longest string parameter (paths, names)
MAX_TEXT = 4096

DTYPES = ("float32", "float64")
#: longest text of a value that an error message repeats
SHOWN_CHARS = 80

KIND_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
              "path": "a path", "choice": "one of the choices", "dtype": "a dtype", "shape": "a shape",
              "size": "a shape or a size", "chunks": "chunks"}


def shown(value) -> str:
    """``repr(value)`` for an error message, cut to :data:`SHOWN_CHARS` (a tenant may send
    megabytes), with NUL and other control characters escaped as repr does."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 (a repr past the int-digits limit, say)
        text = f"<{type(value).__name__}>"
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


@dataclass(frozen=True)
class Target:
    """What the workflow will run on; defaults and automatic chunks depend on it."""

    kind: str = "cpu"  # "gpu" or "cpu"
    n_workers: int = 1
    #: memory each worker may use before it spills (device memory on GPUs)
    worker_bytes: int = 4 * 2**30
    #: the workers' addresses, where known; inputs larger than one worker are spread over them
    workers: tuple[str, ...] = ()
    #: the chunks' array module ("numpy" or "cupy") where it is not the workers' own:
    #: admission before a GPU cluster starts sizes the graph on NumPy metas, since CuPy
    #: metas pull in CUDA (dask's tsqr runs its QR on them: cuSOLVER, a context on GPU 0)
    #: for a graph that is never computed
    chunk_backend: str | None = None


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
        """The clean value, or :class:`ParamError` naming the value and the limit: never any
        other exception, whatever the value (non-finite, huge, NUL-bearing, wrong type)."""
        if value is None:
            if self.optional:
                return None
            raise ParamError(f"{self.name}: a value is required")
        parser = getattr(self, f"_parse_{self.kind}")
        try:
            return parser(value)
        except ParamError:
            raise
        except (ArithmeticError, ValueError, TypeError, RecursionError) as e:
            # a value past what Python's own parsing holds (1e400GB overflows, a 5000-digit
            # integer) is still one line naming it
            self._fail(value, f"cannot be read as {KIND_WORDS.get(self.kind, self.kind)} ({type(e).__name__})")

    def _fail(self, value, why: str):
        raise ParamError(f"{self.name}: {shown(value)} {why}")

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
        if "\x00" in value:
            self._fail(value, "contains a NUL character")
        if any("\ud800" <= c <= "\udfff" for c in value):
            # JSON may carry a lone surrogate ("\ud800"), which no file name can hold: it
            # failed later, in the encoding of a path, with a traceback in the service's log
            self._fail(value, "contains a lone surrogate (not text a path can hold)")
        if len(value) > MAX_TEXT:
            self._fail(value, f"is longer than {MAX_TEXT} characters")
        return value

    _parse_path = _parse_str

    def _parse_choice(self, value):
        """One of ``choices``; ``0`` and ``"0"`` name the same choice, whichever type the
        choices are declared in (``axis=0`` on the command line arrives as an integer)."""
        for choice in self.choices:
            if type(value) is type(choice) and value == choice:
                return choice
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            text = value.strip() if isinstance(value, str) else str(value)
            for choice in self.choices:
                if not isinstance(choice, bool) and str(choice) == text:
                    return choice
        self._fail(value, f"is not one of {', '.join(map(str, self.choices))}")

    def _parse_dtype(self, value):
        if not isinstance(value, str) or value not in DTYPES:
            self._fail(value, f"is not a supported dtype ({', '.join(DTYPES)})")
        return value

    def _parse_shape(self, value) -> tuple[int, ...]:
        return _parse_dims(self, value)

    def _parse_chunks(self, value):
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        if isinstance(value, str) and _looks_like_bytes(value):
            nbytes = self._bytes(value)
            if nbytes > MAX_BYTES:
                self._fail(value, f"exceeds the largest supported size {format_bytes(MAX_BYTES)}")
            return nbytes
        return _parse_dims(self, value)

    def _bytes(self, text: str) -> int:
        try:
            return parse_size(text, name=self.name, minimum=1)
        except OverflowError:
            self._fail(text, f"exceeds the largest supported size {format_bytes(MAX_BYTES)}")
        except ValueError:
            self._fail(text, "is not a size of at least 1 byte (use bytes such as 20GB or 512MiB)")

    def _parse_size(self, value):
        """A shape (``40000x40000``, ``[40000, 40000]``) or a total size (``200GB``)."""
        if isinstance(value, str) and _looks_like_bytes(value):
            nbytes = self._bytes(value)
            if nbytes > MAX_BYTES:
                self._fail(value, f"exceeds the largest supported size {format_bytes(MAX_BYTES)}")
            return nbytes
        if isinstance(value, float):
            self._fail(value, "is not a shape such as 40000x40000 or a size such as 200GB")
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
            # either spelling of a choice is accepted (axis 0 or "0")
            "choice": {"enum": _choice_enum(self.choices)},
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


def _choice_enum(choices) -> list:
    out = list(choices)
    for c in choices:
        if isinstance(c, str) and c.isdigit() and int(c) not in out:
            out.append(int(c))
        elif isinstance(c, int) and not isinstance(c, bool) and str(c) not in out:
            out.append(str(c))
    return out


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
        # only the parameters' names: never a dunder (pickle asks for __setstate__ on an
        # instance whose fields are not set yet) nor a field of its own, which would find
        # Mapping.values, a method, before __post_init__ or __reduce__ set the field
        values = self.__dict__.get("values")
        if values is None or key.startswith("__"):
            raise AttributeError(key)
        try:
            return values[key]
        except KeyError:
            raise AttributeError(key) from None

    def __reduce__(self):
        # rebuilt from plain dicts: a verify job's parameters travel to the reference's child
        # process, whose plain pickle cannot rebuild a mappingproxy
        return type(self), (dict(self.values), dict(self.arrays))

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.values.items()}
