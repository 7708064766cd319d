"""The batched box copies of cuts and assemblies (:mod:`spillway.datapath.collective.copies`):
the table one launch reads, run here by a NumPy interpreter of the kernel over one byte
arena, against NumPy's slicing. The kernel itself runs in the GPU test."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from spillway.datapath.collective.copies import Batch, Flat, box, box_of, in_units, packed, reduced, row_gcd, widest_unit
from spillway.datapath.collective.layout import owner, packing, plan_of


class Arena:
    """Arrays that are views of one byte buffer, so that a table's addresses are offsets."""

    def __init__(self, nbytes: int):
        self.bytes = np.zeros(nbytes + 64, dtype=np.uint8)
        self.used = 16  # an odd start shows in the unit chosen

    def array(self, shape, dtype, *, order="C", align=16):
        dtype = np.dtype(dtype)
        self.used = -(-self.used // align) * align
        n = int(np.prod(shape)) * dtype.itemsize
        flat = self.bytes[self.used: self.used + n].view(dtype)
        self.used += n
        return flat.reshape(shape, order=order)

    def address(self, array) -> int:
        return array.__array_interface__["data"][0] - self.bytes.__array_interface__["data"][0]

    def run(self, batch: Batch) -> int:
        """What the kernel does with the batch's table; returns the unit it moved."""
        rows, gcd = batch.geometry()  # a kept geometry learns its buffers here
        pointers = [self.address(b) for b in batch.buffers]
        unit, table = in_units(rows, gcd, pointers, batch.itemsize)
        for row in table:
            b_src, o_src, b_dst, o_dst, n0, n1, n2, s0, s1, d0, d1 = map(int, row)
            for i0, i1 in itertools.product(range(n0), range(n1)):
                src = pointers[b_src] + o_src + i0 * s0 + i1 * s1
                dst = pointers[b_dst] + o_dst + i0 * d0 + i1 * d1
                assert src % unit == 0 and dst % unit == 0
                self.bytes[dst: dst + n2 * unit] = self.bytes[src: src + n2 * unit]
        assert not batch.one_by_one, "every copy here reduces to three loops"
        return unit


def _add(batch: Batch, src, at, dst, to) -> None:
    # NumPy arrays go one by one in production; the interpreter takes their boxes
    batch.add_boxes(src, box_of(src, at), dst, box_of(dst, to))


GRIDS = [
    # (shape, old chunks, new chunks): panels both ways, odd edges, 3-D, one axis untouched
    ((12, 20), (4, 20), (12, 5)),
    ((13, 21), (5, 21), (13, 4)),
    ((9, 10, 11), (3, 10, 4), (9, 5, 11)),
    ((7, 6, 5), (2, 3, 5), (7, 2, 2)),
    ((17,), (5,), (3,)),
    ((6, 8), (6, 3), (2, 8)),  # column panels to row panels: one-element-wide pieces too
]


def _chunks(shape, chunk):
    return tuple(tuple(min(c, n - s) for s in range(0, n, c)) for n, c in zip(shape, chunk))


@pytest.mark.parametrize("shape, old_chunk, new_chunk", GRIDS)
@pytest.mark.parametrize("dtype", ["float64", "complex128", "int16"])
def test_a_cut_packs_and_an_assembly_joins_as_numpy_slices(shape, old_chunk, new_chunk, dtype):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(shape) * 1000).astype(dtype)
    old, new = _chunks(shape, old_chunk), _chunks(shape, new_chunk)
    plan = plan_of(old, new)
    workers = 2
    arena = Arena(x.nbytes * 4 + 4096 * x.itemsize * 64)
    starts = [np.cumsum((0, *c)) for c in old]
    received: dict = {}  # (input index, worker) -> packed buffer
    for index in itertools.product(*(range(len(c)) for c in old)):
        block_at = tuple(slice(starts[d][i], starts[d][i + 1]) for d, i in enumerate(index))
        block = arena.array(plan.input_shape(index), dtype)
        block[...] = x[block_at]
        batch = Batch(block.dtype.itemsize)
        for d, (total, pieces) in packing(old, new, index, workers).items():
            buffer = received[(index, d)] = arena.array((total,), dtype, align=x.itemsize)
            for offset, piece_shape, src in pieces.values():
                _add(batch, block, src, buffer, Flat(offset, piece_shape))
        arena.run(batch)
        for d, (_, pieces) in packing(old, new, index, workers).items():
            for offset, piece_shape, src in pieces.values():
                got = received[(index, d)][offset: offset + int(np.prod(piece_shape))].reshape(piece_shape)
                np.testing.assert_array_equal(got, block[src])
    new_starts = [np.cumsum((0, *c)) for c in new]
    grid = tuple(map(len, new))
    for index in itertools.product(*(range(len(c)) for c in new)):
        out = arena.array(plan.output_shape(index), dtype)
        batch = Batch(out.dtype.itemsize)
        d = owner(index, grid, workers)
        for i, place in plan.parts_of(index):
            offset, piece_shape, _ = packing(old, new, i, workers)[d][1][index]
            _add(batch, received[(i, d)], Flat(offset, piece_shape), out, place)
        arena.run(batch)
        want = x[tuple(slice(new_starts[a][j], new_starts[a][j + 1]) for a, j in enumerate(index))]
        np.testing.assert_array_equal(out, want)


def test_copies_reduce_to_few_loops_in_the_widest_unit():
    # a row panel's column piece: rows of 8 KB at the panel's pitch, packed contiguous
    src = box(np.empty((1000, 80000)), (slice(0, 1000), slice(3000, 4000)))
    dst = packed(0, (1000, 1000), 8)
    assert reduced(src.shape, src.strides, dst.strides, 8) == [(1000, 640000, 8000), (1000, 8, 8)]
    # a contiguous piece into a column panel: one run
    whole = packed(0, (1000, 1000), 8)
    into = box(np.empty((80000, 1000)), (slice(5000, 6000), slice(0, 1000)))
    assert reduced(whole.shape, whole.strides, into.strides, 8) == [(1_000_000, 8, 8)]
    # axes of one element drop out; an empty copy is no loop
    assert reduced((1, 5, 1), (40, 8, 8), (40, 8, 8), 8) == [(5, 8, 8)]
    assert reduced((0, 5), (40, 8), (40, 8), 8) == []
    # rows: buffers, offsets, extents (the innermost in elements), outer strides
    cut = np.array([[0, 24000, 1, 0, 1, 1000, 1000, 0, 640000, 0, 8000]])
    assert widest_unit(row_gcd(cut, 8)) == 16
    assert in_units(cut.copy(), row_gcd(cut, 8), [256, 512], 8)[0] == 16
    assert in_units(cut.copy(), row_gcd(cut, 8), [256, 520], 8)[0] == 8  # an address 8 past 16
    unit, rows = in_units(cut.copy(), row_gcd(cut, 8), [0, 0], 8)
    assert rows[0, 6] == 500  # 1000 elements of 8 bytes in units of 16
    three = np.array([[0, 0, 1, 0, 1, 1, 3, 0, 0, 0, 0]])  # 24 bytes a row
    assert widest_unit(row_gcd(three, 8)) == 8
    assert widest_unit(row_gcd(np.array([[0, 2, 1, 0, 1, 1, 7, 0, 0, 0, 0]]), 1)) == 1


def test_copies_that_do_not_reduce_go_one_by_one():
    # four axes none of which merge, an F-ordered source, a negative stride
    a = np.empty((3, 4, 5, 6))
    s = box(a, (slice(0, 2), slice(0, 3), slice(0, 4), slice(0, 5)))
    assert reduced(s.shape, s.strides, packed(0, s.shape, 8).strides, 8) is None
    f = np.asfortranarray(np.empty((4, 6, 2)))
    assert reduced((4, 6, 2), f.strides, (96, 16, 8), 8) is None
    # two F-ordered axes still reduce: an element a row
    assert reduced((4, 6), (8, 32), (48, 8), 8) == [(4, 8, 48), (6, 32, 8), (1, 8, 8)]
    assert reduced((4, 6), (-48, 8), (48, 8), 8) is None
    batch = Batch(8)
    batch.add_boxes(a, s, np.empty(120), packed(0, s.shape, 8))
    assert batch.rows == [] and len(batch.one_by_one) == 1


def test_numpy_copies_run_one_by_one():
    x = np.arange(24.0).reshape(4, 6)
    out = np.zeros(12)
    batch = Batch(8)
    batch.add(x, (slice(1, 3), slice(0, 6)), out, Flat(0, (2, 6)))
    batch.run()
    np.testing.assert_array_equal(out, x[1:3].ravel())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "complex128", "int16", "uint8"])
def test_the_kernel_cuts_and_joins_as_cupy_slices(dtype):
    """One launch a cut and a join on the device, bit for bit CuPy's slicing: panels both
    ways, odd edges, 3-D, columns one element wide, an F-ordered block, sources that are
    views at odd offsets (one-byte and two-byte units), long contiguous runs."""
    cupy = pytest.importorskip("cupy")
    from spillway.datapath.collective import copies

    rng = np.random.default_rng(3)
    for shape, old_chunk, new_chunk in [*GRIDS, ((3000, 2500), (1000, 2500), (3000, 700))]:
        x = cupy.asarray((rng.standard_normal(shape) * 100).astype(dtype))
        old, new = _chunks(shape, old_chunk), _chunks(shape, new_chunk)
        plan = plan_of(old, new)
        starts = [np.cumsum((0, *c)) for c in old]
        for index in itertools.product(*(range(len(c)) for c in old)):
            at = tuple(slice(int(starts[d][i]), int(starts[d][i + 1])) for d, i in enumerate(index))
            for block in (x[at], cupy.ascontiguousarray(x[at]), cupy.asfortranarray(x[at])):
                batch = Batch(block.dtype.itemsize)
                buffers = {}
                for d, (total, pieces) in packing(old, new, index, 2).items():
                    buffers[d] = cupy.empty(total + 1, dtype=block.dtype)[1:]  # an odd start
                    for offset, piece_shape, src in pieces.values():
                        batch.add(block, src, buffers[d], Flat(offset, piece_shape))
                batch.run()
                for d, (_, pieces) in packing(old, new, index, 2).items():
                    for offset, piece_shape, src in pieces.values():
                        got = buffers[d][offset: offset + int(np.prod(piece_shape))].reshape(piece_shape)
                        assert bool((got == block[src]).all()), (shape, index, d, src)
        # a join from views of one buffer into an output chunk
        y = x.reshape(-1)
        out = cupy.zeros(shape, dtype=x.dtype)
        batch = Batch(x.dtype.itemsize)
        half = shape[0] // 2
        batch.add(y, Flat(0, (half, *shape[1:])), out, (slice(0, half), *(slice(0, n) for n in shape[1:])))
        rest = (shape[0] - half, *shape[1:])
        batch.add(y, Flat(int(np.prod(shape)) - int(np.prod(rest)), rest), out,
                  (slice(half, shape[0]), *(slice(0, n) for n in shape[1:])))
        batch.run()
        assert bool((out == x).all())
    assert copies._KERNELS, "the batch ran in a launch of the kernel"


def test_a_kept_geometry_copies_other_arrays_of_the_same_shapes():
    """The second batch of a key reuses the first one's rows with its own arrays; an empty
    copy among them makes no row either time."""
    arena = Arena(1 << 16)
    key = ("test", "kept", 1)
    got = []
    for seed in range(2):
        x = arena.array((6, 8), "float64")
        x[...] = np.random.default_rng(seed).standard_normal((6, 8))
        out = arena.array((48,), "float64")
        batch = Batch(8, key=key)
        _add_either(batch, x, (slice(0, 6), slice(0, 3)), out, Flat(0, (6, 3)))
        _add_either(batch, x, (slice(0, 0), slice(0, 8)), out, Flat(18, (0, 8)))
        _add_either(batch, x, (slice(0, 6), slice(3, 8)), out, Flat(18, (6, 5)))
        assert (batch.known is not None) == (seed == 1)
        arena.run(batch)
        np.testing.assert_array_equal(out[:18].reshape(6, 3), x[:, :3])
        np.testing.assert_array_equal(out[18:].reshape(6, 5), x[:, 3:])
        got.append(len(batch.geometry()[0]))
    assert got == [2, 2]


def _add_either(batch: Batch, src, at, dst, to) -> None:
    if batch.known is not None:
        batch.add(src, at, dst, to)  # a kept geometry takes only the arrays
    else:
        _add(batch, src, at, dst, to)
