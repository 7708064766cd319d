"""NumPy float64 references for the checked workloads and the matrix, from the seeds alone.

The seeded generator is chunk-invariant, so a reference regenerates the array in row
panels of about :data:`PANEL_BYTES` in parallel processes and reduces each to a few
statistics (sum, column and row sums, Gram matrix, ...): nothing the size of the array is
held. Shortcuts: ``sum(x @ y) = colsum(x) . rowsum(y)``; a rechunk's sum is its input's;
tall-skinny factorisations are checked through ``x.T @ x``.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
from collections.abc import Iterable

import numpy as np

#: bytes of one panel a reference process generates at a time (the generator's
#: temporaries take a few times this; small, since the cluster's pinned pools stay up)
PANEL_BYTES = 256 * 2**20

#: what a panel can be reduced to
STATS = ("sum", "sumsq", "colsum", "colsumsq", "rowsum", "edgesum", "gram", "xtb")


def default_processes() -> int:
    """Host cores for the reference, leaving two for the cluster's processes."""
    return max(1, (os.cpu_count() or 2) - 2)


def _panel(args) -> dict:
    from spillway.workflows import random

    seed, stream, shape, start, stop, dtype, wanted, b_stream = args
    rest = tuple((0, n) for n in shape[1:])
    block = random.uniform_block(seed, stream, shape, ((start, stop), *rest), dtype, "numpy").astype(np.float64)
    out = {"start": start, "stop": stop}
    if "sum" in wanted:
        out["sum"] = float(block.sum())
    if "sumsq" in wanted:
        out["sumsq"] = float(np.square(block).sum())
    if "colsum" in wanted:
        out["colsum"] = block.reshape(block.shape[0], -1).sum(axis=0)
    if "colsumsq" in wanted:
        out["colsumsq"] = np.square(block).reshape(block.shape[0], -1).sum(axis=0)
    if "rowsum" in wanted:
        out["rowsum"] = block.reshape(block.shape[0], -1).sum(axis=1)
    if "edgesum" in wanted:  # per row of a 3-D array: its plane's four edges, corners twice
        out["edgesum"] = (block[:, 0, :].sum(axis=1) + block[:, -1, :].sum(axis=1)
                          + block[:, :, 0].sum(axis=1) + block[:, :, -1].sum(axis=1))
    if "gram" in wanted:
        out["gram"] = block.T @ block
    if "xtb" in wanted:
        b = random.uniform_block(seed, b_stream, (shape[0],), ((start, stop),), dtype, "numpy").astype(np.float64)
        out["xtb"] = block.T @ b
    return out


def panel_stats(shape: tuple[int, ...], seed: int, *, stream: int = 0, dtype: str = "float64",
                wanted: Iterable[str] = ("sum",), b_stream: int = 1, processes: int | None = None) -> dict:
    """Statistics of the seeded array (``stream``) of ``shape`` in float64, panel by panel:
    ``sum``, ``sumsq`` (scalars), ``colsum`` and ``colsumsq`` (sums and sums of squares per
    trailing element), ``rowsum`` (per row),
    ``edgesum`` (per row of a 3-D array, the sum over its plane's four edges),
    ``gram`` (``x.T @ x`` of a 2-D array) and ``xtb`` (``x.T @ b`` with ``b`` the seeded
    vector of ``b_stream`` and ``shape[0]`` elements)."""
    wanted = tuple(wanted)
    unknown = set(wanted) - set(STATS)
    if unknown:
        raise ValueError(f"unknown statistics {sorted(unknown)} (known: {', '.join(STATS)})")
    shape = tuple(int(n) for n in shape)
    row_bytes = math.prod(shape[1:]) * np.dtype(dtype).itemsize
    rows = max(1, min(shape[0], PANEL_BYTES // max(1, row_bytes)))
    tasks = [(seed, stream, shape, s, min(shape[0], s + rows), dtype, wanted, b_stream)
             for s in range(0, shape[0], rows)]
    processes = min(processes or default_processes(), len(tasks))
    if processes == 1:
        parts = list(map(_panel, tasks))
    else:
        with mp.get_context("spawn").Pool(processes) as pool:
            parts = list(pool.imap_unordered(_panel, tasks, chunksize=1))
    parts.sort(key=lambda p: p["start"])
    out: dict = {}
    for name in ("sum", "sumsq"):
        if name in wanted:
            out[name] = math.fsum(p[name] for p in parts)
    for name in ("colsum", "colsumsq", "gram", "xtb"):
        if name in wanted:
            out[name] = np.sum([p[name] for p in parts], axis=0)
    for name in ("rowsum", "edgesum"):
        if name in wanted:
            out[name] = np.concatenate([p[name] for p in parts])
    return out


def array_sum(shape, seed: int, dtype: str = "float64", *, stream: int = 0, processes: int | None = None) -> float:
    """``x.sum()`` in float64 for the seeded uniform ``x`` of ``stream``."""
    return panel_stats(shape, seed, stream=stream, dtype=dtype, processes=processes)["sum"]


def transpose_sum(shape: tuple[int, int], seed: int, dtype: str = "float64", *,
                  processes: int | None = None) -> float:
    """``(x + x.T).sum()`` in float64 for the seeded uniform ``x`` (stream 0): twice the
    sum of x, summed panel by panel."""
    return 2 * array_sum(shape, seed, dtype, processes=processes)


def matmul_sum(shape: tuple[int, int], seed: int, dtype: str = "float64", *,
               processes: int | None = None) -> float:
    """``(x @ y).sum()`` in float64 for the seeded ``x`` (stream 0, ``shape``) and ``y``
    (stream 1, ``shape`` transposed): ``sum_k colsum(x)[k] * rowsum(y)[k]``."""
    colsum = panel_stats(shape, seed, stream=0, dtype=dtype, wanted=("colsum",), processes=processes)["colsum"]
    rowsum = panel_stats(tuple(shape)[::-1], seed, stream=1, dtype=dtype, wanted=("rowsum",),
                         processes=processes)["rowsum"]
    return math.fsum(colsum * rowsum)


def column_and_row_sums(shape: tuple[int, int], seed: int, dtype: str = "float64", *,
                        processes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The column sums and row sums of the seeded ``x`` (stream 0) in float64: a rechunk
    moves values and changes none, so its result has the same; a value put in the wrong
    row or column changes both."""
    s = panel_stats(shape, seed, dtype=dtype, wanted=("colsum", "rowsum"), processes=processes)
    return s["colsum"], s["rowsum"]


def fft_axis0_checks(shape: tuple[int, int], seed: int, *, processes: int | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """For ``X = fft(x, axis=0)`` of the seeded complex ``x`` (real part stream 0,
    imaginary part stream 1, float64 each): ``X[0, :]``, which is the column sums of x,
    and each column's energy ``sum_k |X[k, j]|^2``, which is ``n * sum_i |x[i, j]|^2``
    (Parseval). The first checks the phases of one frequency, the second the magnitudes
    of all, without forming X."""
    wanted = ("colsum", "colsumsq")
    real = panel_stats(shape, seed, stream=0, wanted=wanted, processes=processes)
    imag = panel_stats(shape, seed, stream=1, wanted=wanted, processes=processes)
    n = shape[0]
    return real["colsum"] + 1j * imag["colsum"], n * (real["colsumsq"] + imag["colsumsq"])


def laplacian_plane_sums(shape: tuple[int, int, int], seed: int, dtype: str = "float32", *,
                         processes: int | None = None) -> np.ndarray:
    """For ``L`` the 7-point Laplacian of the seeded 3-D ``x`` (stream 0) with a zero
    boundary, each plane's sum ``L[k].sum()`` in float64: the neighbours along axis 0 give
    ``S[k-1] + S[k+1]`` (``S`` the planes' sums, 0 past the ends), and within a plane each
    value counts once for every neighbour it has there less six, which is ``-2 S[k]`` less
    the plane's edges (corners twice). A halo face left out or put in the wrong place
    changes the sums of the planes beside it."""
    s = panel_stats(shape, seed, dtype=dtype, wanted=("rowsum", "edgesum"), processes=processes)
    planes = s["rowsum"]
    padded = np.concatenate([[0.0], planes, [0.0]])
    return padded[:-2] + padded[2:] - 2 * planes - s["edgesum"]


def gram(shape: tuple[int, int], seed: int, dtype: str = "float64", *, stream: int = 0,
         processes: int | None = None) -> np.ndarray:
    """``x.T @ x`` in float64 of the seeded tall-skinny ``x``."""
    return panel_stats(shape, seed, stream=stream, dtype=dtype, wanted=("gram",), processes=processes)["gram"]
