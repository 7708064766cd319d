"""Copies of rectangular regions between device arrays, one call each.

A cut writes 80 pieces of a chunk and a join 80 pieces into one (W3); through CuPy's
indexing each costs a view, shape checks and an elementwise kernel's launch, about 60-130
microseconds of Python a piece, which added up to 6 ms a cut and 11 ms a join of 640 MB
that the device copies in a third of a millisecond (benchmarks/NOTES.md). Where a region
of a C-contiguous array is rows of contiguous bytes at a fixed pitch (any region of a 2-D
array; in more dimensions, one whose axes after the cut one are whole and before it at
most one spans more than one index), :func:`copy` is one ``cudaMemcpy2DAsync`` on the
current stream. Anything else, and NumPy arrays, go through indexing.
"""

from __future__ import annotations

#: cudaMemcpyDeviceToDevice
_DEVICE_TO_DEVICE = 3


def rows(array, index: tuple[slice, ...]):
    """``(address, pitch, width, height)`` in bytes of ``array[index]`` as rows of
    contiguous bytes, or None where it is not one (or ``array`` is not C-contiguous)."""
    shape = array.shape
    if not array.flags.c_contiguous or len(index) != len(shape):
        return None
    bounds = [s.indices(n) for s, n in zip(index, shape)]
    if any(step != 1 for _, _, step in bounds):
        return None
    lengths = [stop - start for start, stop, _ in bounds]
    if any(n <= 0 for n in lengths):
        return None
    # k: the last axis not taken whole (0 where every axis is): the bytes from it on make
    # each row, and the axis before it counts the rows
    k = len(shape) - 1
    while k > 0 and lengths[k] == shape[k]:
        k -= 1
    item = array.dtype.itemsize
    inner = 1
    for n in shape[k + 1:]:
        inner *= n
    width = lengths[k] * inner * item
    if k == 0:
        height, pitch = 1, width
    else:
        if any(lengths[a] != 1 for a in range(k - 1)):
            return None  # rows along more than one axis: no one pitch
        height, pitch = lengths[k - 1], array.strides[k - 1]
    offset = sum(start * stride for (start, _, _), stride in zip(bounds, array.strides))
    return array.data.ptr + offset, pitch, width, height


def copy(dst, dst_index: tuple[slice, ...], src, src_index: tuple[slice, ...]) -> None:
    """``dst[dst_index] = src[src_index]``; one 2-D copy where both are CuPy regions of
    rows of the same width and count."""
    if type(dst).__module__.startswith("cupy") and type(src).__module__.startswith("cupy"):
        to, frm = rows(dst, dst_index), rows(src, src_index)
        if to is not None and frm is not None:
            same = to[2:] == frm[2:]
            if not same and to[2] * to[3] == frm[2] * frm[3]:
                # one side is a whole contiguous block: read it as the other's rows
                if _contiguous(to):
                    to, same = (to[0], frm[2], frm[2], frm[3]), True
                elif _contiguous(frm):
                    frm, same = (frm[0], to[2], to[2], to[3]), True
            if same:
                import cupy

                cupy.cuda.runtime.memcpy2DAsync(to[0], to[1], frm[0], frm[1], to[2], to[3], _DEVICE_TO_DEVICE,
                                                cupy.cuda.get_current_stream().ptr)
                return
    dst[dst_index] = src[src_index]


def _contiguous(region) -> bool:
    _, pitch, width, height = region
    return height == 1 or pitch == width


def whole(shape) -> tuple[slice, ...]:
    return tuple(slice(0, n) for n in shape)
