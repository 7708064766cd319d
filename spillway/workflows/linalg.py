"""Linear algebra: matmul ``x @ y``, and tall-skinny QR and SVD (dask's tsqr).

matmul contracts chunk rows of ``x`` with chunk columns of ``y``: every output chunk
needs a whole row of chunks and a whole column of chunks, so chunks cross between
workers many times. tsqr factors each row panel on its worker and combines only the
small ``R`` factors, the usual way to factor a matrix far taller than one GPU.

The references are NumPy float64: for matmul, a window of ``x @ y`` from the same rows
of ``x`` and columns of ``y``; for QR, ``|R|`` (R is unique up to the signs of its rows)
and for SVD the singular values, both from a float64 QR of the input's row panels.
"""

from __future__ import annotations

import numpy as np

from spillway.options.errors import ParamError

from . import inputs
from .chunking import panel_rows, resolve_chunks
from .params import Param, Params, Target
from .workflow import Workflow
from .results import FULL_CHECK_BYTES, REFERENCE_WHOLE_BYTES, array_run, first_boundary, footprint, window

# --- matmul

MATMUL_PARAMS = (
    *inputs.size_params((2500, 2500), (32768, 32768), what="Shape of x (y is its transpose's shape)"),
    inputs.input_param(what="x"),
    inputs.input_param("input_y", what="y"),
)


def _matmul_shapes(params: Params, target: Target):
    xshape, xdtype = inputs.describe(params)
    yshape, ydtype = inputs.describe(params, name="y", input_name="input_y", shape=xshape[::-1])
    if xshape[1] != yshape[0]:
        raise ParamError(f"y: shape {yshape[0]}x{yshape[1]} does not match x {xshape[0]}x{xshape[1]} "
                         f"(x @ y needs y to have {xshape[1]} rows)")
    if xdtype != ydtype:
        raise ParamError(f"y: dtype {ydtype} differs from x's {xdtype}")
    xchunks = resolve_chunks(params.chunks, xshape, xdtype, target)
    ychunks = (xchunks[1], min(xchunks[0], yshape[1]))
    return xshape, yshape, xchunks, ychunks


def matmul_check(params: Params, target: Target) -> None:
    _matmul_shapes(params, target)


def matmul_build(params: Params, target: Target):
    xshape, yshape, xchunks, ychunks = _matmul_shapes(params, target)
    xs = inputs.open_source(params, target, xchunks)
    ys = inputs.open_source(params, target, ychunks, name="y", stream=1, input_name="input_y", shape=xshape[::-1])
    z = xs.array @ ys.array
    n, k, m = xshape[0], xshape[1], yshape[1]
    itemsize = z.dtype.itemsize
    if n * m * itemsize <= FULL_CHECK_BYTES:
        rows, cols = slice(0, n), slice(0, m)
    else:
        rows = window(n, first_boundary(z.chunks[0]), 128)
        cols = window(m, first_boundary(z.chunks[1]), 128)

    def reference():
        a = xs.region((rows, slice(0, k)))
        b = ys.region((slice(0, k), cols))
        return a @ b, f"numpy float64 x[{rows.start}:{rows.stop}] @ y[:, {cols.start}:{cols.stop}]"

    chunk_bytes = int(np.prod(z.chunksize)) * itemsize
    fp = footprint(xs.nbytes + ys.nbytes, n * m * itemsize, chunk_bytes, target.n_workers, temporaries=4)
    built = array_run(z, probe=z[rows, cols], reference=reference, footprint=fp, source=xs)
    built.bytes_read += ys.bytes_read
    built.optimize_graph = not (xs.placed or ys.placed)
    if ys.placed:
        summarize = built.summarize

        def summarize_both(value):
            out = summarize(value)
            out["input_bytes_per_worker"] = {w: xs.placement.get(w, 0) + ys.placement.get(w, 0)
                                             for w in set(xs.placement) | set(ys.placement)}
            return out

        built.summarize = summarize_both
    return built


def matmul_graph(workflow, params: Params, target: Target):
    """x @ y: every row-chunk of x meets every column-chunk of y along each of the k chunks
    of the contraction, so the products grow as the cube of the chunks per side."""
    from .workflow import BYTES_PER_TASK, GraphSize, input_chunks

    per_axis = input_chunks(params, target)
    if per_axis is None:
        return None
    rows, inner = per_axis
    tasks = 8 * rows * inner + 2 * rows * rows * inner
    return GraphSize(tasks=tasks, client_bytes=tasks * BYTES_PER_TASK,
                     why=f"{rows * rows * inner:,} chunk products of {rows}x{inner} chunks")


def matmul_project(params: Params, target: Target):
    """The footprint :func:`matmul_build` makes, from the parameters alone (no graph)."""
    xshape, yshape, xchunks, ychunks = _matmul_shapes(params, target)
    itemsize = np.dtype(inputs.describe(params)[1]).itemsize
    n, k, m = xshape[0], xshape[1], yshape[1]
    return footprint((n * k + k * m) * itemsize, n * m * itemsize, xchunks[0] * ychunks[1] * itemsize,
                     target.n_workers, temporaries=4)


MATMUL = Workflow(
    name="matmul",
    description="x @ y of seeded random matrices (y has x's transposed shape); chunks cross between workers",
    params=MATMUL_PARAMS,
    build=matmul_build,
    check=matmul_check,
    array_inputs=("x", "y"),
    graph=matmul_graph,
    project=matmul_project,
)

# --- tall-skinny QR and SVD

TS_PARAMS = (
    *inputs.size_params((200_000, 32), (8_000_000, 128), what="Tall-skinny shape (rows x columns)",
                        chunks_help=inputs.PANELS_HELP),
    Param("columns", "int", "Columns of the matrix when size is given in bytes", default=32, gpu_default=128,
          minimum=1, maximum=2**16),
    inputs.input_param(),
)


def _ts_chunks(params: Params, target: Target):
    shape, dtype = inputs.describe(params, columns=params.columns)
    rows, cols = shape
    if cols > rows:
        raise ParamError(f"size: {rows}x{cols} is not tall-skinny (more columns than rows)")
    if params.chunks != "auto" and not isinstance(params.chunks, int) and params.chunks[-1] != cols \
            and len(params.chunks) > 1:
        raise ParamError(f"chunks: {'x'.join(map(str, params.chunks))} must span all {cols} columns (row panels)")
    panel = panel_rows(params.chunks, shape, dtype, target)
    if panel < cols:
        raise ParamError(f"chunks: row panels of {panel} rows are shorter than the {cols} columns; "
                         f"tsqr needs each panel at least as tall as it is wide")
    return shape, dtype, (panel, cols)


def ts_check(params: Params, target: Target) -> None:
    _ts_chunks(params, target)


#: the Gram matrix's R is used where its error, machine epsilon times the condition
#: number squared, stays this far under the float64 tolerance
GRAM_MARGIN = 100


def reference_r(source) -> np.ndarray:
    """R of the input in float64, up to row signs: by QR of the whole input where it is
    small; else from the Gram matrix ``x.T @ x`` summed over row panels, whose Cholesky
    factor is R, where the input is well enough conditioned for that to be as exact as
    the check needs; else by QR of the row panels and of their stacked Rs.

    The Gram matrix is matrix products over panels the BLAS runs on every core; a QR of
    each panel is not (LAPACK's tall-skinny QR scales poorly with threads): on the H100
    host the panel QR of a 108 GB input took over 4.5 minutes, against 12.6 s for the
    run it checked."""
    if source.nbytes * 8 // np.dtype(source.dtype).itemsize <= REFERENCE_WHOLE_BYTES:
        return np.linalg.qr(source.whole(), mode="r")
    r = _gram_r(source)
    if r is not None:
        return r
    rs = [r for _, _, r in source.panels(then=lambda p: np.linalg.qr(p, mode="r"))]
    return np.linalg.qr(np.vstack(rs), mode="r")


def _gram_r(source) -> np.ndarray | None:
    """The Cholesky factor of the input's Gram matrix, or None where the input's
    condition number makes it too inexact (or it is singular)."""
    from .results import tolerance

    n = source.shape[1]
    gram = np.zeros((n, n))
    for _, _, panel in source.panels(budget=512 * 2**20):
        gram += panel.T @ panel
    eigenvalues = np.linalg.eigvalsh(gram)
    if eigenvalues[0] <= 0:
        return None
    condition_squared = eigenvalues[-1] / eigenvalues[0]
    if np.finfo(np.float64).eps * condition_squared * GRAM_MARGIN > tolerance(source.dtype):
        return None
    return np.linalg.cholesky(gram).T


def _ts_footprint(nbytes: int, kind: str, chunk_bytes: int, target: Target):
    """tsqr: the input and Q at once (its reconstruction check reads both again)."""
    return footprint(nbytes, nbytes, chunk_bytes, target.n_workers, temporaries=4)


#: what the svd holds beside the input-sized Q of dask's first tsqr stage, as a share of
#: the input: each input block is freed once its QR is made and each U block is summed (or
#: written) as it is made, so only Q1 stays whole; measured, device limit plus spilled bytes
#: were 1.02x the input on one H200 (136 GB) and 1.10x on one H100 (108 GB). A quarter keeps
#: a margin over both.
SVD_MARGIN = 0.25


def _svd_footprint(nbytes: int, kind: str, chunk_bytes: int, target: Target):
    """svd: Q1 (the input's size) and a margin, not the input and U at once; where the
    input is the caller's array (persisted, or in memory), it stays held beside Q1."""
    beside = int(nbytes * SVD_MARGIN) + (nbytes if kind == "array" else 0)
    return footprint(nbytes, beside, chunk_bytes, target.n_workers, temporaries=6)


def _projector(footprint_of):
    """The workflow's footprint from its parameters alone, the same function its build
    uses: admission before a cluster starts needs no graph, nor dask.array (and, with it,
    CuPy) imported, to refuse a run."""

    def project(params: Params, target: Target):
        shape, dtype, chunks = _ts_chunks(params, target)
        itemsize = np.dtype(dtype).itemsize
        return footprint_of(shape[0] * shape[1] * itemsize, inputs.source_kind(params),
                            chunks[0] * chunks[1] * itemsize, target)

    return project


def _built_footprint(footprint_of, source, chunks, target):
    itemsize = np.dtype(source.dtype).itemsize
    return footprint_of(source.nbytes, source.kind, chunks[0] * chunks[1] * itemsize, target)


def tsqr_build(params: Params, target: Target):
    import dask.array as da

    shape, _, chunks = _ts_chunks(params, target)
    source = inputs.open_source(params, target, chunks, columns=params.columns)
    x = source.array
    q, r = da.linalg.qr(x)
    gram = q.T @ q  # n x n: orthogonality is judged on the client from it
    reconstruction = da.linalg.norm(q @ r - x) / da.linalg.norm(x)

    def extra(values):
        from .backend import to_numpy

        g = np.asarray(to_numpy(values[0]), dtype=np.float64)
        orthogonality = np.linalg.norm(g - np.eye(g.shape[0])) / np.sqrt(g.shape[0])
        return {"orthogonality": float(orthogonality), "reconstruction": float(to_numpy(values[1]))}

    def reference():
        return np.abs(reference_r(source)), "numpy float64 |R| of the input's QR"

    return array_run(q, probe=abs(r), reference=reference,
                     footprint=_built_footprint(_ts_footprint, source, chunks, target),
                     source=source, extra=extra, more=(gram, reconstruction))


def svd_build(params: Params, target: Target):
    import dask.array as da

    shape, _, chunks = _ts_chunks(params, target)
    source = inputs.open_source(params, target, chunks, columns=params.columns)
    u, s, v = da.linalg.svd(source.array)

    def extra(values):
        from .backend import to_numpy

        sv = to_numpy(values[0])
        return {"singular_max": float(sv.max()), "singular_min": float(sv.min())}

    def reference():
        return np.linalg.svd(reference_r(source), compute_uv=False), \
            "numpy float64 singular values (of the input's R)"

    return array_run(u, probe=s, reference=reference,
                     footprint=_built_footprint(_svd_footprint, source, chunks, target),
                     source=source, extra=extra, more=(s,))


TSQR = Workflow(
    name="tsqr",
    description="Tall-skinny QR (dask tsqr) of a seeded random matrix in row panels; writes Q",
    params=TS_PARAMS,
    build=tsqr_build,
    check=ts_check,
    array_inputs=("x",),
    project=_projector(_ts_footprint),
)

SVD = Workflow(
    name="svd",
    description="Tall-skinny SVD (dask tsqr) of a seeded random matrix in row panels; writes U",
    params=TS_PARAMS,
    build=svd_build,
    check=ts_check,
    array_inputs=("x",),
    project=_projector(_svd_footprint),
)
