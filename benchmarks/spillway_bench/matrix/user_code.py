"""User-written dask code on persisted inputs: tall-skinny QR, SVD and least squares, a
matmul, a ``map_overlap`` Laplacian, reductions and a rechunk with dask's defaults, each
with its projected footprint and its check against a NumPy float64 reference from the
seeds (:mod:`spillway_bench.reference`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cases import Case
from .scale import SEED, Scale, grow

#: relative error a user-code answer may have (workflows carry their own tolerances)
TOLERANCE = 1e-10
#: least squares is checked against the normal equations, which square the condition
#: number (about sqrt(3 n) for uniform inputs): a looser bound
LSTSQ_TOLERANCE = 1e-8


@dataclass
class UserBuilt:
    """One user-code case at a size: its persisted-input arrays, lazy results, projected
    footprint and check."""

    inputs: dict
    results: Callable[[dict], tuple]
    footprint: Any
    #: (computed values) -> relative error against the NumPy float64 reference
    check: Callable[[tuple], float]
    tolerance: float = TOLERANCE
    reference: str = ""


def _square_chunk(nbytes: int, kind: str) -> int:
    """Side of square float64 chunks: 10000 (800 MB) on GPUs, about 1/16 of the array on CPU."""
    if kind == "gpu":
        return 10000
    return max(16, int(math.sqrt(nbytes / 16 / 8)))


def _panel_rows(rows: int, cols: int, kind: str) -> int:
    """Rows of tall-skinny panels: 512 MiB on GPUs, about 1/16 of the array on CPU."""
    per = (512 * 2**20 if kind == "gpu" else rows * cols * 8 // 16) // (cols * 8)
    return max(cols, min(rows, per))


def _rel(computed, expected) -> float:
    from spillway.workflows.workflow import relative_error

    return float(relative_error(computed, np.asarray(expected, dtype=np.float64)))


TALL_COLUMNS = 32


def _tall(nbytes: int, kind: str, seed: int, backend: str, *, with_b: bool = False):
    from spillway.workflows import random

    rows = max(TALL_COLUMNS, nbytes // (TALL_COLUMNS * 8))
    panel = _panel_rows(rows, TALL_COLUMNS, kind)
    x = random.uniform((rows, TALL_COLUMNS), (panel, TALL_COLUMNS), seed=seed, backend=backend)
    inputs = {"x": x}
    if with_b:
        inputs["b"] = random.uniform((rows,), (panel,), seed=seed, stream=1, backend=backend)
    return rows, panel, inputs


def _fp(input_bytes, output_bytes, chunk_bytes, n_workers, temporaries):
    from spillway.workflows.results import footprint

    return footprint(input_bytes, output_bytes, chunk_bytes, n_workers, temporaries=temporaries)


def _abs_r(r):
    from spillway.workflows.backend import to_numpy

    return np.abs(np.asarray(to_numpy(r), dtype=np.float64))


def user_qr(nbytes, scale, seed, backend):
    import dask.array as da

    from ..reference import gram

    rows, panel, inputs = _tall(nbytes, scale.kind, seed, backend)
    shape = (rows, TALL_COLUMNS)

    def results(x):
        q, r = da.linalg.qr(x["x"])
        return r, (q.T @ q)

    def check(values):
        g = gram(shape, seed)
        r_ref = np.linalg.cholesky(g).T  # R.T @ R = x.T @ x, R up to the signs of its rows
        return _rel(_abs_r(values[0]), np.abs(r_ref))

    size = rows * TALL_COLUMNS * 8
    return UserBuilt(inputs, results, _fp(size, size, panel * TALL_COLUMNS * 8, scale.n_workers, 4), check,
                     reference="|R| against the Cholesky factor of x.T @ x (float64, from the seed)")


def user_svd(nbytes, scale, seed, backend):
    import dask.array as da

    from ..reference import gram

    rows, panel, inputs = _tall(nbytes, scale.kind, seed, backend)
    shape = (rows, TALL_COLUMNS)

    def results(x):
        u, s, v = da.linalg.svd(x["x"])
        return s, u.sum()

    def check(values):
        from spillway.workflows.backend import to_numpy

        expected = np.sqrt(np.linalg.eigvalsh(gram(shape, seed)))[::-1]
        return _rel(np.sort(np.asarray(to_numpy(values[0]), dtype=np.float64))[::-1], expected)

    size = rows * TALL_COLUMNS * 8
    return UserBuilt(inputs, results, _fp(size, size, panel * TALL_COLUMNS * 8, scale.n_workers, 4), check,
                     reference="singular values against sqrt(eig(x.T @ x)) (float64, from the seed)")


def user_lstsq(nbytes, scale, seed, backend):
    import dask.array as da

    from ..reference import panel_stats

    rows, panel, inputs = _tall(nbytes, scale.kind, seed, backend, with_b=True)
    shape = (rows, TALL_COLUMNS)

    def results(x):
        coef, residuals, rank, sv = da.linalg.lstsq(x["x"], x["b"])
        return (coef,)

    def check(values):
        from spillway.workflows.backend import to_numpy

        stats = panel_stats(shape, seed, wanted=("gram", "xtb"), b_stream=1)
        expected = np.linalg.solve(stats["gram"], stats["xtb"])
        return _rel(np.asarray(to_numpy(values[0]), dtype=np.float64), expected)

    size = rows * TALL_COLUMNS * 8
    return UserBuilt(inputs, results, _fp(size + rows * 8, size, panel * TALL_COLUMNS * 8, scale.n_workers, 4),
                     check, tolerance=LSTSQ_TOLERANCE,
                     reference="coefficients against the normal equations (x.T @ x) c = x.T @ b (float64)")


def _square(nbytes, scale, seed, backend, *, streams=(0,)):
    from spillway.workflows import random

    n = max(4, int(math.sqrt(nbytes / 8)))
    c = min(n, _square_chunk(n * n * 8, scale.kind))
    arrays = {name: random.uniform((n, n), (c, c), seed=seed, stream=s, backend=backend)
              for name, s in zip(("x", "y"), streams)}
    return n, c, arrays


def user_matmul(nbytes, scale, seed, backend):
    from ..reference import matmul_sum

    n, c, inputs = _square(nbytes, scale, seed, backend, streams=(0, 1))

    def results(x):
        return ((x["x"] @ x["y"]).sum(),)

    def check(values):
        return _rel(values[0], matmul_sum((n, n), seed))

    a = n * n * 8
    return UserBuilt(inputs, results, _fp(2 * a, a, c * c * 8, scale.n_workers, 4), check,
                     reference="sum_k colsum(x)[k] * rowsum(y)[k] (float64, from the seed)")


def laplacian_2d(block):
    """5-point Laplacian of a block with its halo (trimmed off by map_overlap)."""
    out = block * block.dtype.type(-4)
    out[1:, :] += block[:-1, :]
    out[:-1, :] += block[1:, :]
    out[:, 1:] += block[:, :-1]
    out[:, :-1] += block[:, 1:]
    return out


def _probe(n: int, c: int, width: int = 64) -> tuple[slice, slice]:
    """A window across the first chunk boundary (or the middle of one chunk)."""
    from spillway.workflows.results import window

    boundary = c if n > c else n // 2
    return window(n, boundary, width), window(n, boundary, width)


def user_map_overlap(nbytes, scale, seed, backend):
    from spillway.workflows import random

    n, c, inputs = _square(nbytes, scale, seed, backend)
    rows, cols = _probe(n, c)

    def results(x):
        y = x["x"].map_overlap(laplacian_2d, depth=1, boundary=0)
        return y.sum(), y[rows, cols]

    def region(r0, r1, c0, c1):
        return random.uniform_block(seed, 0, (n, n), ((r0, r1), (c0, c1)), "float64", "numpy")

    def check(values):
        from spillway.workflows.backend import to_numpy

        # the sum of a Laplacian with zeros outside is minus the sums of the four edges
        edges = region(0, 1, 0, n).sum() + region(n - 1, n, 0, n).sum() \
            + region(0, n, 0, 1).sum() + region(0, n, n - 1, n).sum()
        r0, r1 = max(0, rows.start - 1), min(n, rows.stop + 1)
        c0, c1 = max(0, cols.start - 1), min(n, cols.stop + 1)
        padded = np.pad(region(r0, r1, c0, c1), 1)  # zeros past the array's edges
        lap = laplacian_2d(padded)[1:-1, 1:-1]
        window = lap[rows.start - r0:rows.stop - r0, cols.start - c0:cols.stop - c0]
        return max(_rel(values[0], -edges), _rel(np.asarray(to_numpy(values[1]), dtype=np.float64), window))

    a = n * n * 8
    return UserBuilt(inputs, results, _fp(a, a, (c + 2) ** 2 * 8, scale.n_workers, 4), check,
                     reference="minus the edge sums, and a window across chunk boundaries (float64, from the seed)")


def user_reductions(nbytes, scale, seed, backend):
    from ..reference import panel_stats

    n, c, inputs = _square(nbytes, scale, seed, backend)

    def results(x):
        return x["x"].mean(axis=0), x["x"].std()

    def check(values):
        from spillway.workflows.backend import to_numpy

        stats = panel_stats((n, n), seed, wanted=("sum", "sumsq", "colsum"))
        count = n * n
        mean = stats["sum"] / count
        std = math.sqrt(stats["sumsq"] / count - mean * mean)
        return max(_rel(np.asarray(to_numpy(values[0]), dtype=np.float64), stats["colsum"] / n),
                   _rel(values[1], std))

    a = n * n * 8
    return UserBuilt(inputs, results, _fp(a, 0, c * c * 8, scale.n_workers, 2), check,
                     reference="column means and std from float64 column sums, sum and sum of squares")


def user_rechunk(nbytes, scale, seed, backend):
    from spillway.workflows import random

    from ..reference import array_sum

    n = max(4, int(math.sqrt(nbytes / 8)))
    panel = max(1, min(n, (1000 if scale.kind == "gpu" else max(1, n // 16))))
    inputs = {"x": random.uniform((n, n), (panel, n), seed=seed, backend=backend)}
    rows, cols = _probe(n, panel, 256)

    def results(x):
        # what a user writes: dask's default method (P2P for an all-to-all with a client up)
        y = x["x"].rechunk((n, panel))
        return y.sum(), y[rows, cols]

    def check(values):
        from spillway.workflows.backend import to_numpy

        window = random.uniform_block(seed, 0, (n, n), ((rows.start, rows.stop), (cols.start, cols.stop)),
                                      "float64", "numpy")
        return max(_rel(values[0], array_sum((n, n), seed)),
                   _rel(np.asarray(to_numpy(values[1]), dtype=np.float64), window))

    a = n * n * 8
    return UserBuilt(inputs, results, _fp(a, a, panel * n * 8, scale.n_workers, 3), check,
                     reference="the input's sum and a window of its values (float64, from the seed)")


#: user-code cases: (nbytes of input, scale, seed, backend) -> UserBuilt
USER_CODE: dict[str, Callable] = {
    "qr": user_qr, "svd": user_svd, "lstsq": user_lstsq, "matmul": user_matmul,
    "map_overlap": user_map_overlap, "reductions": user_reductions, "rechunk": user_rechunk,
}


def user_size(case: Case, scale: Scale, seed: int = SEED) -> int:
    """Input bytes of a user-code case whose projected footprint reaches the target."""
    build = USER_CODE[case.workflow]
    return grow(lambda n: build(n, scale, seed, "numpy").footprint.total_bytes, scale.target_bytes,
                scale.target_bytes // 2)
