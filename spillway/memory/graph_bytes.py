"""The bytes of a graph's keys before any of them runs, and the most a graph holds at once.

A dask array says the shape of every chunk (``.chunks``) and its dtype, so the bytes of
each of its keys are known from the collection alone: legacy arrays carry them in their
graph's layers (``collection_annotations``, which dask sets for every array layer),
array expressions on their nodes. :func:`chunk_layers` reads them from the expression a
client sends, whichever client it is (the scheduler reads it, :mod:`spillway.memory.capacity`);
:func:`key_bytes` gives each key of the materialized graph its bytes: a chunk's from its
array, a ``getitem`` of a chunk (a rechunk's pieces) from the slice, an alias its
target's, and what ``compute`` hands back (``finalize``) the sum of what it gathers.
Keys of anything else (dataframes, delayed) have no size here: they count as nothing.

:func:`peak_bytes` runs the graph in its priority order (dask's order, as one worker
thread would) and keeps count of what is held: every output from its task on, every
intermediate until its last dependent has run. The largest count is what the graph needs
beside what the cluster already holds, at the least.

A user computes the same collection again and again (``(x + x.T).sum().compute()`` in a
loop, a notebook cell run again): its graph comes with the same keys each time but the
last few (``compute``'s ``finalize`` is named afresh each time), and a key names one value
(dask's contract), so :func:`graph_bytes` sizes only the keys it has not sized lately
(:class:`_Known`), from the shapes of those it has where it can (the expression is then
not read), and looks the others up.
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping

from .. import upstream

#: the annotation that carries a key's bytes from the expression to the scheduler plugin
NBYTES = "spillway-nbytes"
#: keys whose bytes are kept in each of the two generations of :class:`_Known` (an
#: entry holds its key: a graph of more keys than this is sized every time, keeping none)
KNOWN_KEYS = 200_000


def chunk_layers(expr) -> dict[str, tuple[tuple, int]]:
    """name -> (chunks, itemsize) for every dask array in ``expr`` (an expression as
    ``Client.persist`` and ``Client.compute`` send it); arrays of object dtype left out."""
    types = upstream.expression_types()
    if types is None:
        return {}
    Expr, HLGExpr = types
    out: dict[str, tuple[tuple, int]] = {}
    stack, seen = [expr], set()
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, HLGExpr):
            for name, layer in getattr(e.hlg, "layers", {}).items():
                info = getattr(layer, "collection_annotations", None) or {}
                if "Array" in str(info.get("type", "")) and not _reduces(layer):
                    _add(out, name, info.get("chunks"), info.get("dtype"))
        elif type(e).__module__.startswith("dask.array"):
            try:
                _add(out, upstream.expression_name(e), e.chunks, e.dtype)
            except Exception:  # noqa: BLE001 (a node that cannot say its chunks has no size here)
                pass
        stack.extend(o for o in e.operands if isinstance(o, Expr))
    return out


def _reduces(layer) -> bool:
    """A reduction's first layer (each block's partial result, ``keepdims=True``): dask
    makes it with its input's chunks and sets the reduced ones after, so the chunks its
    layer says are its input's, not its own."""
    task = getattr(layer, "task", None)
    return type(layer).__name__ == "Blockwise" and "keepdims" in (getattr(task, "kwargs", None) or {})


def _add(out: dict, name, chunks, dtype) -> None:
    import numpy as np

    if name is None or chunks is None or dtype is None:
        return
    dtype = np.dtype(dtype)
    if dtype.hasobject or any(math.isnan(c) for dim in chunks for c in dim):  # unknown chunks
        return
    out[name] = (tuple(tuple(int(c) for c in dim) for dim in chunks), int(dtype.itemsize))


def graph_bytes(expr, dsk: Mapping) -> dict[Hashable, int]:
    """The bytes of the keys of ``dsk`` (the materialized ``expr``) that can be told."""
    if len(dsk) > KNOWN_KEYS:
        return key_bytes(dsk, chunk_layers(expr))
    known = _known.lookup(dsk)
    sizes = {k: entry[0] for k, entry in known.items() if entry[0]}
    if len(known) < len(dsk):
        missing = [k for k in dsk if k not in known]
        shapes = _Shapes(known)
        # the expression is read only where a key's shape is not known already: a compute
        # run again sizes its finalize keys from the shapes of the chunks they gather
        found = key_bytes(dsk, _Layers(expr), missing, shapes)
        _known.add({k: (found.get(k, 0), shapes.own(k)) for k in missing})
        sizes.update(found)
    return sizes


class _Layers(Mapping):
    """:func:`chunk_layers` of an expression, read at the first look."""

    def __init__(self, expr):
        self._expr = expr
        self._layers: dict | None = None

    def _read(self) -> dict:
        if self._layers is None:
            self._layers = chunk_layers(self._expr)
        return self._layers

    def __getitem__(self, name):
        return self._read()[name]

    def __contains__(self, name) -> bool:
        return name in self._read()

    def __iter__(self):
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


class _Shapes(dict):
    """The shapes :func:`key_bytes` works out, over those of the keys known already
    (``known``: key -> (bytes, shape))."""

    def __init__(self, known: Mapping):
        super().__init__()
        self._known = known

    def __contains__(self, key) -> bool:
        return dict.__contains__(self, key) or key in self._known

    def __getitem__(self, key):
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        return self._known[key][1]

    def own(self, key):
        return dict.get(self, key)


class _Known:
    """The bytes and shapes of the keys sized lately (bytes 0: a key with no size here;
    shape None: none of its own, as ``compute``'s finalize), in two
    generations: keys are added to the newer one, and looked up in both (one found in the
    older moves to the newer); once the newer holds :data:`KNOWN_KEYS` keys it becomes the
    older, and the older is dropped. So what a user computes again stays, what is not
    asked for again goes within two generations, and a lookup costs a dict's get a key.
    Graphs are materialized off the scheduler's event loop (distributed's offload
    thread): the generations change under a lock."""

    def __init__(self):
        self._newer: dict = {}
        self._older: dict = {}
        self._lock = threading.Lock()

    def lookup(self, keys: Iterable[Hashable]) -> dict[Hashable, tuple]:
        with self._lock:
            newer, older = self._newer, self._older
            out = {}
            for k in keys:
                n = newer.get(k)
                if n is None:
                    n = older.get(k)
                    if n is None:
                        continue
                    newer[k] = n
                out[k] = n
            self._turn()
            return out

    def add(self, entries: Mapping[Hashable, tuple]) -> None:
        with self._lock:
            self._newer.update(entries)
            self._turn()

    def _turn(self) -> None:
        if len(self._newer) >= KNOWN_KEYS:
            self._older, self._newer = self._newer, {}

    def clear(self) -> None:
        with self._lock:
            self._newer, self._older = {}, {}

    def __contains__(self, key) -> bool:
        with self._lock:
            return key in self._newer or key in self._older


_known = _Known()


def key_bytes(dsk: Mapping, layers: Mapping[str, tuple[tuple, int]],
              keys: Iterable[Hashable] | None = None, shapes: dict | None = None) -> dict[Hashable, int]:
    """Bytes of each key of ``dsk`` (a materialized graph: key -> task), or of ``keys``
    among them, that ``layers`` (from :func:`chunk_layers`) or its task can say.
    ``shapes``: key -> (shape, itemsize) or None, those known already; it is given the
    shapes worked out."""
    shapes = {} if shapes is None else shapes

    def shape_of(key, depth=0):
        if key in shapes:
            return shapes[key]
        found = _chunk_shape(key, layers)
        if found is None and depth < 32:
            found = _derived_shape(dsk.get(key), lambda k: shape_of(k, depth + 1))
        shapes[key] = found
        return found

    def size_of(key) -> int:
        found = shape_of(key)
        if found is not None:
            return math.prod(found[0]) * found[1]
        task = dsk.get(key)
        gathered = _finalize_bytes(key, task, shape_of)
        if not gathered and _is_alias(task):
            target = dsk.get(task.target)
            gathered = _finalize_bytes(task.target, target, shape_of)
        return gathered

    sizes: dict = {}
    for key in dsk if keys is None else keys:
        n = size_of(key)
        if n:
            sizes[key] = n
    return sizes


def _is_alias(task) -> bool:
    Alias = upstream.task_spec_types()[0]
    return isinstance(task, Alias) and task.target != task.key


def _chunk_shape(key, layers):
    if type(key) is not tuple or not key or not isinstance(key[0], str):
        return None
    name = key[0] if key[0] in layers else _fused_into(key[0], layers)
    if name is None:
        return None
    chunks, itemsize = layers[name]
    index = key[1:]
    if len(index) != len(chunks):
        return None
    try:
        return tuple(dim[i] for dim, i in zip(chunks, index)), itemsize
    except (IndexError, TypeError):
        return None


def _fused_into(name: str, layers) -> str | None:
    """The layer whose task a fused key's task ends with: dask's low-level fusion names a
    chain of tasks by their layers' prefixes joined, ending with the last one's name
    (``rechunk-split-rechunk-merge-<token>``), and keeps its index."""
    at = name.find("-")
    while at != -1:
        tail = name[at + 1:]
        if tail in layers:
            return tail
        at = name.find("-", at + 1)
    return None


def _derived_shape(task, shape_of):
    """A getitem of a chunk: the slice's shape; an alias: its target's."""
    Alias, Task, TaskRef = upstream.task_spec_types()
    if isinstance(task, Alias):
        return shape_of(task.target) if task.target != task.key else None
    if not isinstance(task, Task) or not _is_getitem(task.func) or len(task.args) != 2:
        return None
    source, index = task.args
    if not isinstance(source, (TaskRef, Alias)):
        return None
    found = shape_of(source.key if isinstance(source, TaskRef) else source.target)
    if found is None:
        return None
    shape = _sliced(found[0], index)
    return None if shape is None else (shape, found[1])


def _is_getitem(func) -> bool:
    """``operator.getitem`` or dask's array ``chunk.getitem`` (a rechunk's pieces)."""
    return func is operator.getitem or (getattr(func, "__name__", None) == "getitem"
                                        and getattr(func, "__module__", None) in ("dask.array.chunk", "_operator"))


def _sliced(shape: tuple, index) -> tuple | None:
    """The shape of ``array[index]`` for an index of slices, integers and None."""
    if not isinstance(index, tuple):
        index = (index,)
    out, dim = [], 0
    for item in index:
        if item is None:
            out.append(1)
        elif isinstance(item, slice):
            if dim >= len(shape):
                return None
            out.append(len(range(*item.indices(shape[dim]))))
            dim += 1
        elif isinstance(item, int):
            dim += 1
        else:  # a list, an array, Ellipsis: not worked out here
            return None
    return tuple(out) + tuple(shape[dim:])


def _finalize_bytes(key, task, shape_of) -> int:
    """What ``compute`` hands back gathers its array's chunks on one worker: their sum."""
    name = key[0] if type(key) is tuple and key else key
    if task is None or "finalize" not in str(name):  # finalize-..., blocks-finalize-... (fused)
        return 0
    total = 0
    for dep in getattr(task, "dependencies", ()):
        found = shape_of(dep)
        if found is not None:
            total += math.prod(found[0]) * found[1]
    return total


def peak_bytes(order: Iterable[Hashable], dependencies: Callable[[Hashable], Iterable[Hashable]],
               sizes: Mapping[Hashable, int], keep: set, aliases: Mapping[Hashable, Hashable] | None = None) -> int:
    """The most the tasks ``order`` (soonest first) hold at once when run one after the
    other: each key's bytes from its task on, freed after its last dependent among them
    unless it is in ``keep`` (the outputs). Inputs outside ``order`` (held already) are
    not counted. ``aliases`` (key -> the key it names) hold no bytes of their own: an
    alias kept keeps what it names."""
    if aliases:
        sizes = dict(sizes)
        for alias, target in aliases.items():  # the target's value is the alias's
            sizes[target] = max(sizes.get(target, 0), sizes.get(alias, 0))
            sizes[alias] = 0
        keep = set(keep) | {aliases[k] for k in keep if k in aliases}
    order = list(order)
    members = set(order)
    waiting: dict = {}
    for key in order:
        for dep in dependencies(key):
            if dep in members:
                waiting[dep] = waiting.get(dep, 0) + 1
    live = peak = 0
    for key in order:
        live += sizes.get(key, 0)
        peak = max(peak, live)
        for dep in dependencies(key):
            left = waiting.get(dep)
            if left is None:
                continue
            if left == 1:
                del waiting[dep]
                if dep not in keep:
                    live -= sizes.get(dep, 0)
            else:
                waiting[dep] = left - 1
    return peak
