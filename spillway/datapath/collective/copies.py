"""Many box copies of one cut or one assembly in one kernel launch.

A cut writes each piece of its input chunk into the buffer it is sent in, and an assembly
writes each piece it took into its output chunk: 80 to 160 strided copies a chunk in the
workflows' panel rechunks. One CuPy assignment a piece costs 60-130 us of the host (a
view, a shape check, a launch) against some microseconds of the device, and that host
time holds the GIL the worker's event loop needs to serve its peers (two H200s, W3:
6.1 ms a cut, 10.7 ms a join; benchmarks/NOTES.md). Here every copy of a batch is a row
of one table and one launch does them all.

A box is a strided block of a buffer: a byte offset from the buffer's first element, a
shape and byte strides. Each copy is reduced to at most three nested loops: axes of one
element dropped, axes that are contiguous in both source and destination merged, the
innermost moved in units of up to 16 bytes (a single element where no axis is contiguous
in both). The kernel walks each copy's rows in segments, so that a copy of few long rows
(a contiguous piece) is spread over many blocks too. A copy that does not reduce so (more
loops left, a negative stride) is made by CuPy, alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: fields of a row of the table: source buffer and byte offset, destination buffer and
#: byte offset, the three extents (the innermost in units), the two outer byte strides of
#: the source and of the destination
FIELDS = 11
#: units a block moves of one row at a time: long rows are split so
SEGMENT_UNITS = 2048
THREADS = 256
#: blocks a launch aims at over all its copies (an H100 has 132 SMs)
TARGET_BLOCKS = 4096
_UNITS = {16: "uint4", 8: "unsigned long long", 4: "unsigned int", 2: "unsigned short", 1: "unsigned char"}

_SOURCE = r"""
template<typename T>
__global__ void copy_boxes(const long long* __restrict__ table, const unsigned long long* __restrict__ bases,
                           const int copies) {
    for (int p = blockIdx.y; p < copies; p += gridDim.y) {
        const long long* r = table + 11 * p;
        const char* src = (const char*)bases[r[0]] + r[1];
        char* dst = (char*)bases[r[2]] + r[3];
        const long long n1 = r[5], n2 = r[6];
        const long long segments = (n2 + SEGMENT - 1) / SEGMENT;
        const long long items = r[4] * n1 * segments;
        for (long long item = blockIdx.x; item < items; item += gridDim.x) {
            const long long row = item / segments;
            const long long start = (item - row * segments) * SEGMENT;
            const long long i0 = row / n1, i1 = row - i0 * n1;
            const T* s = (const T*)(src + i0 * r[7] + i1 * r[8]) + start;
            T* d = (T*)(dst + i0 * r[9] + i1 * r[10]) + start;
            const long long stop = min(n2 - start, (long long)SEGMENT);
            for (long long k = threadIdx.x; k < stop; k += blockDim.x) d[k] = s[k];
        }
    }
}
"""


@dataclass(frozen=True)
class Box:
    """A strided block of a buffer: ``offset`` bytes from its first element, ``shape``,
    byte ``strides``."""

    offset: int
    shape: tuple
    strides: tuple


def box(array, index: tuple) -> Box:
    """The box ``array[index]`` (slices of step 1, one an axis) of ``array``."""
    offset = 0
    shape = []
    for s, n, stride in zip(index, array.shape, array.strides):
        start, stop, step = s.indices(n)
        if step != 1:
            raise ValueError(f"a box takes slices of step 1, not {step}")
        offset += start * stride
        shape.append(max(stop - start, 0))
    return Box(offset, tuple(shape), tuple(array.strides))


def packed(offset: int, shape: tuple, itemsize: int) -> Box:
    """The C-contiguous box of ``shape`` at element ``offset`` of a flat buffer."""
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return Box(offset * itemsize, tuple(shape), tuple(reversed(strides)))


def reduced(shape: tuple, src: tuple, dst: tuple, itemsize: int) -> list | None:
    """The copy of ``shape`` from source strides ``src`` to destination strides ``dst``
    as at most three ``(extent, source stride, destination stride)`` loops, the innermost
    of stride ``itemsize`` in both (one of a single element where no axis is); None
    where it does not reduce so. An empty copy is ``[]``."""
    if any(n == 0 for n in shape):
        return []
    axes = [(n, s, d) for n, s, d in zip(shape, src, dst) if n != 1]
    if not axes:
        return [(1, itemsize, itemsize)]
    merged = [axes[-1]]
    for n, s, d in reversed(axes[:-1]):
        inner_n, inner_s, inner_d = merged[-1]
        if s == inner_s * inner_n and d == inner_d * inner_n:
            merged[-1] = (n * inner_n, inner_s, inner_d)
        else:
            merged.append((n, s, d))
    merged.reverse()
    if merged[-1][1] != itemsize or merged[-1][2] != itemsize:
        merged.append((1, itemsize, itemsize))  # a column, or an F-ordered block: an element a row
    if len(merged) > 3:
        return None
    if any(s < 0 or d < 0 for _, s, d in merged):
        return None
    return merged


def widest_unit(gcd: int) -> int:
    """The widest unit of 16, 8, 4, 2 or 1 bytes that divides ``gcd``."""
    for unit in (16, 8, 4, 2):
        if gcd % unit == 0:
            return unit
    return 1


def row_gcd(rows, itemsize: int) -> int:
    """The greatest common divisor of every row's innermost run (bytes), outer strides and
    offsets: with the buffers' addresses, what the unit must divide."""
    import numpy as np

    if len(rows) == 0:
        return 0
    values = np.concatenate([rows[:, 6] * itemsize, rows[:, [1, 3, 7, 8, 9, 10]].ravel()])
    return int(np.gcd.reduce(values))


@dataclass(frozen=True)
class Flat:
    """Elements ``offset`` on of a flat buffer, as a C-contiguous block of ``shape``."""

    offset: int
    shape: tuple


def box_of(array, where) -> Box:
    """The box ``where`` (slices, or :class:`Flat`) of ``array``."""
    if isinstance(where, Flat):
        return packed(where.offset, where.shape, array.itemsize)
    return box(array, where)


def view_of(array, where):
    if isinstance(where, Flat):
        return array[where.offset: where.offset + math.prod(where.shape)].reshape(where.shape)
    return array[where]


@dataclass(frozen=True)
class Geometry:
    """What a batch's copies are, apart from the arrays: its rows (buffer columns left to
    fill), which of its copies made a row (an empty copy makes none), and the rows' GCD."""

    rows: object
    made_row: tuple
    gcd: int


#: geometry key -> :class:`Geometry`: the same cut or join of the same rechunk lists the
#: same copies, only of other arrays
_GEOMETRIES: dict = {}
GEOMETRIES_KEPT = 4096


class Batch:
    """The copies of one cut or one assembly: ``add(src, at, dst, to)`` copies ``src[at]``
    into ``dst[to]`` (``at`` and ``to`` slices, or :class:`Flat`); :meth:`run` makes them,
    CuPy arrays' in one launch. The arrays are of one dtype; a view is a buffer of its
    own (its boxes count from its first element).

    ``key``: whatever fixes every ``at``, ``to`` and the arrays' strides, in the order the
    copies are added. The first batch of a key works out its copies' boxes and loops (some
    microseconds a copy), later ones only take the arrays' addresses."""

    def __init__(self, itemsize: int, key=None):
        self.itemsize = itemsize
        self.key = key
        self.known: Geometry | None = _GEOMETRIES.get(key) if key is not None else None
        self.buffers: list = []
        self._ids: dict = {}
        self.rows: list = []
        #: per copy added: its arrays, and whether it made a row
        self.pairs: list = []
        self.made_row: list = []
        #: copies that do not reduce to three loops, and NumPy's: one by one
        self.one_by_one: list = []

    def _buffer(self, array) -> int:
        found = self._ids.get(id(array))
        if found is None:
            found = self._ids[id(array)] = len(self.buffers)
            self.buffers.append(array)
        return found

    def add(self, src, at, dst, to) -> None:
        if self.known is not None:
            self.pairs.append((src, dst))
            return
        if not type(src).__module__.startswith("cupy"):
            self.one_by_one.append((src, at, dst, to))
            return
        self.add_boxes(src, box_of(src, at), dst, box_of(dst, to))

    def add_boxes(self, src, src_box: Box, dst, dst_box: Box) -> None:
        if src_box.shape != dst_box.shape:
            raise ValueError(f"a copy of {src_box.shape} into {dst_box.shape}")
        loops = reduced(src_box.shape, src_box.strides, dst_box.strides, self.itemsize)
        if loops is None:
            self.one_by_one.append((src, src_box, dst, dst_box))
            return
        self.pairs.append((src, dst))
        self.made_row.append(bool(loops))
        if not loops:
            return
        while len(loops) < 3:
            loops.insert(0, (1, 0, 0))
        (n0, s0, d0), (n1, s1, d1), (n2, _, _) = loops
        self.rows.append((self._buffer(src), src_box.offset, self._buffer(dst), dst_box.offset,
                          n0, n1, n2, s0, s1, d0, d1))

    def geometry(self):
        """The rows (a table of :data:`FIELDS` columns, buffer columns filled) and their GCD,
        kept under the batch's key where every copy reduced."""
        import numpy as np

        if self.known is not None:
            rows = self.known.rows.copy()
            src, dst = [], []
            for (a, b), made in zip(self.pairs, self.known.made_row):
                if made:
                    src.append(self._buffer(a))
                    dst.append(self._buffer(b))
            rows[:, 0], rows[:, 2] = src, dst
            return rows, self.known.gcd
        rows = np.array(self.rows, dtype=np.int64).reshape(-1, FIELDS)
        gcd = row_gcd(rows, self.itemsize)
        if self.key is not None and not self.one_by_one:
            if len(_GEOMETRIES) >= GEOMETRIES_KEPT:
                _GEOMETRIES.pop(next(iter(_GEOMETRIES)))
            _GEOMETRIES[self.key] = Geometry(rows.copy(), tuple(self.made_row), gcd)
        return rows, gcd

    def run(self) -> None:
        """Every copy of the batch, on the current stream; nothing waits for it."""
        if self.pairs:
            rows, gcd = self.geometry()
            if len(rows):
                _launch(rows, gcd, self.buffers, self.itemsize)
        for src, at, dst, to in self.one_by_one:
            if isinstance(at, Box):
                _view(dst, to)[...] = _view(src, at)
            else:
                view_of(dst, to)[...] = view_of(src, at)


def in_units(rows, gcd: int, pointers, itemsize: int):
    """The unit a launch moves (what divides the rows' GCD and every buffer's address) and
    the rows with their innermost extents in it."""
    import numpy as np

    unit = widest_unit(int(np.gcd.reduce(np.append(np.asarray(pointers, dtype=np.uint64), np.uint64(gcd)))))
    if unit != itemsize:
        rows[:, 6] = rows[:, 6] * itemsize // unit
    return unit, rows


def _launch(rows, gcd: int, buffers: list, itemsize: int) -> None:
    import cupy
    import numpy as np

    pointers = np.array([b.data.ptr for b in buffers], dtype=np.uint64)
    unit, rows = in_units(rows, gcd, pointers, itemsize)
    # one upload for the table and the buffers' addresses
    on_device = cupy.asarray(np.concatenate([rows.ravel(), pointers.view(np.int64)]))
    copies = len(rows)
    items = int((rows[:, 4] * rows[:, 5] * -(-rows[:, 6] // SEGMENT_UNITS)).max())
    grid = (max(1, min(items, -(-TARGET_BLOCKS // copies))), min(copies, 65535))
    _kernel(unit)(grid, (THREADS,), (on_device, on_device[rows.size:], np.int32(copies)))


_KERNELS: dict = {}


def _kernel(unit: int):
    found = _KERNELS.get(unit)
    if found is None:
        import cupy

        name = f"copy_boxes<{_UNITS[unit]}>"
        module = cupy.RawModule(code=_SOURCE, options=(f"-DSEGMENT={SEGMENT_UNITS}",), name_expressions=[name])
        found = _KERNELS[unit] = module.get_function(name)
    return found


def _view(array, b: Box):
    """``b`` of ``array`` as an array (the copies the kernel does not make)."""
    import cupy

    return cupy.ndarray(b.shape, dtype=array.dtype, memptr=array.data + b.offset, strides=b.strides)
