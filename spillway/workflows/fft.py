"""fft: the discrete Fourier transform along axis 0, which the input is chunked along.

An FFT needs the whole axis in one piece, so the row-chunked input is first rechunked
into column panels (an all-to-all exchange, spillway's collective), then each panel is transformed on its worker
with CuPy's cuFFT or NumPy's pocketfft. The reference transforms a window of columns of
the same input in NumPy float64 (complex128).
"""

from __future__ import annotations

import numpy as np

from spillway.datapath.collective import rechunk

from . import inputs
from .backend import module_of
from .chunking import panel_rows, resolve_chunks
from .params import Params, Target
from .workflow import Workflow
from .results import FULL_CHECK_BYTES, array_run, first_boundary, footprint, window

PARAMS = (*inputs.size_params((4096, 2048), (65536, 32768), what="Shape (transform length x columns)"),
          inputs.input_param())


def _chunks(params: Params, target: Target):
    shape, dtype = inputs.describe(params)
    chunks = resolve_chunks(params.chunks, shape, dtype, target)
    # column panels holding the whole transform axis, of about one chunk's bytes
    cols = panel_rows("auto" if params.chunks == "auto" else chunks[0] * chunks[1] * np.dtype(dtype).itemsize,
                      shape[::-1], dtype, target)
    return shape, chunks, (shape[0], cols)


def check(params: Params, target: Target) -> None:
    _chunks(params, target)


def _fft_axis0(block):
    return module_of(block).fft.fft(block, axis=0)


def build(params: Params, target: Target):
    from dask.array.utils import meta_from_array

    shape, chunks, panels = _chunks(params, target)
    source = inputs.open_source(params, target, chunks)
    x = source.array
    out_dtype = np.result_type(x.dtype, np.complex64)
    panels_x = rechunk(x, panels)
    y = panels_x.map_blocks(_fft_axis0, dtype=out_dtype, meta=meta_from_array(x, dtype=out_dtype))
    itemsize = np.dtype(out_dtype).itemsize
    if shape[0] * shape[1] * itemsize <= FULL_CHECK_BYTES:
        cols = slice(0, shape[1])
    else:
        cols = window(shape[1], first_boundary(y.chunks[1]), 8)

    def reference():
        return np.fft.fft(source.region((slice(0, shape[0]), cols)), axis=0), \
            f"numpy complex128 fft(x[:, {cols.start}:{cols.stop}], axis=0)"

    # the submission was sized by the same function, from the parameters alone
    fp = project(params, target)
    return array_run(y, probe=y[:, cols], reference=reference, footprint=fp, source=source)


def project(params: Params, target: Target):
    """The footprint :func:`build` makes, from the parameters alone (no graph)."""
    shape, _, panels = _chunks(params, target)
    dtype = inputs.describe(params)[1]
    itemsize = np.dtype(np.result_type(dtype, np.complex64)).itemsize
    return footprint(shape[0] * shape[1] * np.dtype(dtype).itemsize, shape[0] * shape[1] * itemsize,
                     panels[0] * panels[1] * itemsize, target.n_workers, temporaries=4)


WORKFLOW = Workflow(
    name="fft",
    description="FFT along axis 0 of a seeded random array chunked along that axis (rechunk, then cuFFT)",
    params=PARAMS,
    build=build,
    check=check,
    array_inputs=("x",),
    project=project,
)
