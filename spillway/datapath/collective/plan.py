"""Which piece of which input chunk goes to which output chunk: the plan of a rechunk as a
collective, worked out from the two chunk grids alone (no array, no dask graph).

An output axis is either chunk sizes (a rechunk) or *windows*, ``(start, stop)`` pairs that
may overlap one another (a halo exchange: each output chunk is an input chunk grown by its
neighbours' faces, as ``dask.array.overlap`` makes them); pieces of one input then go to
several outputs.

Along each axis the old and new boundaries overlap in runs: a boundary both grids share
splits the axis, and a rechunk never moves bytes across it. The runs of all axes make the
*partials*: independent exchanges, each with its own inputs, outputs and barrier (dask's
P2P rechunk splits the same way), so that a rechunk along one axis is many small
exchanges rather than one that holds the whole array.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass


def _bounds(chunks: tuple[int, ...]) -> list[int]:
    return [0, *itertools.accumulate(chunks)]


def axis_overlaps(old: tuple[int, ...], new: tuple[int, ...]) -> list[list[tuple[int, slice, slice]]]:
    """For each old chunk along one axis: ``(new index, slice in the old chunk, slice in
    the new chunk)`` for every new chunk it overlaps, in order. Empty chunks overlap
    nothing."""
    ob, nb = _bounds(old), _bounds(new)
    if ob[-1] != nb[-1]:
        raise ValueError(f"chunks of {ob[-1]} and {nb[-1]} elements along one axis")
    out: list[list[tuple[int, slice, slice]]] = [[] for _ in old]
    b = 0
    for a in range(len(old)):
        lo, hi = ob[a], ob[a + 1]
        if lo == hi:
            continue
        while nb[b + 1] <= lo:
            b += 1
        k = b
        while k < len(new) and nb[k] < hi:
            start, stop = max(lo, nb[k]), min(hi, nb[k + 1])
            if start < stop:
                out[a].append((k, slice(start - lo, stop - lo), slice(start - nb[k], stop - nb[k])))
            k += 1
    return out


def axis_runs(old: tuple[int, ...], new: tuple[int, ...]) -> list[tuple[range, range]]:
    """The runs of one axis: (old indices, new indices) between boundaries both grids
    share. A chunk belongs to the run its start lies in; a chunk of no elements at the
    axis' end goes with the last run, so every index has one run."""
    ob, nb = _bounds(old), _bounds(new)
    shared = sorted(set(ob) & set(nb))
    if len(shared) < 2:  # an axis of no elements
        return [(range(len(old)), range(len(new)))]
    cuts = shared[1:-1]

    def members(bounds, n):
        runs = [[] for _ in range(len(shared) - 1)]
        for a in range(n):
            runs[sum(1 for c in cuts if c <= bounds[a])].append(a)
        return runs

    olds, news = members(ob, len(old)), members(nb, len(new))
    return [(range(o[0], o[-1] + 1) if o else range(0), range(m[0], m[-1] + 1) if m else range(0))
            for o, m in zip(olds, news)]


def windows_of(axis) -> tuple[tuple[int, int], ...] | None:
    """The ``(start, stop)`` windows of an output axis given as windows; None for chunk sizes."""
    if axis and isinstance(axis[0], (tuple, list)):
        return tuple((int(a), int(b)) for a, b in axis)
    return None


def axis_window_overlaps(old: tuple[int, ...], windows) -> list[list[tuple[int, slice, slice]]]:
    """:func:`axis_overlaps` for output windows, which may overlap: for each old chunk,
    ``(window index, slice in the old chunk, slice in the window)`` for every window it
    meets, in order."""
    ob = _bounds(old)
    if windows and max(b for _, b in windows) > ob[-1]:
        raise ValueError(f"windows reach {max(b for _, b in windows)} on an axis of {ob[-1]} elements")
    out: list[list[tuple[int, slice, slice]]] = [[] for _ in old]
    for a in range(len(old)):
        lo, hi = ob[a], ob[a + 1]
        for k, (start_k, stop_k) in enumerate(windows):
            start, stop = max(lo, start_k), min(hi, stop_k)
            if start < stop:
                out[a].append((k, slice(start - lo, stop - lo), slice(start - start_k, stop - start_k)))
    return out


def axis_window_runs(old: tuple[int, ...], windows) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """:func:`axis_runs` for output windows: the old chunks and windows that share bytes,
    directly or through each other, form one run (a halo joins each chunk to its
    neighbours; a window of depth 0 is its chunk alone). A chunk or window of no elements
    goes with the run before it (the first run where none is before)."""
    overlaps = axis_window_overlaps(old, windows)
    parent = list(range(len(old) + len(windows)))

    def root(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, met in enumerate(overlaps):
        for k, _, _ in met:
            parent[root(len(old) + k)] = root(a)
    met_windows = {k for met in overlaps for k, _, _ in met}
    order: list[int] = []
    members: dict[int, tuple[list[int], list[int]]] = {}

    def place(node, kind, index, last):
        r = root(node) if last is None else last
        if r not in members:
            order.append(r)
            members[r] = ([], [])
        members[r][kind].append(index)
        return r

    last = None
    for a in range(len(old)):
        last = place(a, 0, a, None if overlaps[a] else last)
    last = None
    for k in range(len(windows)):
        last = place(len(old) + k, 1, k, None if k in met_windows else last)
    if not order:  # an axis of no elements
        return [(tuple(range(len(old))), tuple(range(len(windows))))]
    return [(tuple(members[r][0]), tuple(members[r][1])) for r in order]


@dataclass(frozen=True)
class Partial:
    """One independent exchange: its input and output chunk indices (N-D)."""

    inputs: tuple[tuple[int, ...], ...]
    outputs: tuple[tuple[int, ...], ...]

    @property
    def exchanges(self) -> bool:
        """Whether bytes meet here from several inputs into several outputs: a plain split
        (one input) or merge (one output) needs no collective."""
        return len(self.inputs) > 1 and len(self.outputs) > 1


class ExchangePlan:
    """The rechunk of an array of ``old`` chunks into ``new`` chunks (tuples of tuples,
    as ``dask.array.Array.chunks``; an axis of ``new`` may be windows instead,
    :func:`windows_of`)."""

    def __init__(self, old: tuple[tuple[int, ...], ...], new: tuple[tuple, ...]):
        if len(old) != len(new):
            raise ValueError(f"{len(old)} axes in, {len(new)} out")
        self.old = tuple(tuple(int(c) for c in axis) for axis in old)
        windows = [windows_of(axis) for axis in new]
        self.new = tuple(w if w is not None else tuple(int(c) for c in axis) for w, axis in zip(windows, new))
        #: the output chunks' sizes along each axis
        self.sizes = tuple(tuple(b - a for a, b in w) if w is not None else axis for w, axis in zip(windows, self.new))
        self._overlaps = [axis_overlaps(o, n) if w is None else axis_window_overlaps(o, w)
                          for o, n, w in zip(self.old, self.new, windows)]
        self._parts: dict = {}
        runs = [axis_runs(o, n) if w is None else axis_window_runs(o, w)
                for o, n, w in zip(self.old, self.new, windows)]
        self.partials: tuple[Partial, ...] = tuple(
            Partial(inputs=tuple(itertools.product(*(r[0] for r in combo))),
                    outputs=tuple(itertools.product(*(r[1] for r in combo))))
            for combo in itertools.product(*runs))

    @property
    def exchanges(self) -> bool:
        return any(p.exchanges for p in self.partials)

    def input_shape(self, index: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(axis[i] for axis, i in zip(self.old, index))

    def output_shape(self, index: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(axis[i] for axis, i in zip(self.sizes, index))

    def pieces_of(self, index: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[slice, ...]]]:
        """What input chunk ``index`` sends: (output index, its slice of the input chunk)."""
        per_axis = [self._overlaps[d][i] for d, i in enumerate(index)]
        return [(tuple(o[0] for o in combo), tuple(o[1] for o in combo)) for combo in itertools.product(*per_axis)]

    def parts_of(self, index: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[slice, ...]]]:
        """What output chunk ``index`` is made of: (input index, where its piece goes in the
        output chunk); worked out once an output chunk (every assembly of it asks)."""
        found = self._parts.get(index)
        if found is None:
            found = self._parts[index] = self._parts_of(index)
        return found

    def _parts_of(self, index: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[slice, ...]]]:
        per_axis = []
        for d, j in enumerate(index):
            per_axis.append([(a, dst) for a, overlaps in enumerate(self._overlaps[d])
                             for (b, _src, dst) in overlaps if b == j])
        return [(tuple(p[0] for p in combo), tuple(p[1] for p in combo)) for combo in itertools.product(*per_axis)]

    def pieces(self) -> int:
        """How many pieces move in all (the tasks method makes a task of each)."""
        return math.prod(sum(len(o) for o in axis) for axis in self._overlaps)

    def tasks(self) -> int:
        """Tasks of the collective: one per input and output chunk, one barrier a partial."""
        return (math.prod(len(a) for a in self.old) + math.prod(len(a) for a in self.new)
                + len(self.partials))
