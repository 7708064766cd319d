"""O3, O4 and O5: W3's rechunk, W4's FFT and W5's stencil as a user writes them (no
rechunk method), past the GPUs' memory, in every plain ``spillway bench``.

At ``full`` the peak footprint (input and output held together) is
:func:`footprint_factor` times the GPUs' memory (1.5x with two GPUs or more, 2.5x on one;
O5 1.3x), never more than three quarters of the host's (:data:`HOST_SHARE`). Each side
(``spillway``, ``tasks_method``, ``baseline``) runs on a cluster of its own and its first
run is ``first_s``. Checked without gathering: O3's column and row sums, O4's row 0 and
each column's energy (Parseval), O5's plane sums, against NumPy float64 from the seed.
"""

from __future__ import annotations

from . import expressions as ex
from .checked import side_for
from .workload import Workload

#: the peak footprint over the GPUs' memory at full size, by how many GPUs hold it
FOOTPRINT_MANY_GPUS = 1.5
FOOTPRINT_ONE_GPU = 2.5
#: rows of an input panel and columns of an output panel (W3's and W4's)
PANEL = 1000
#: the side of O4's square input chunks (W4's)
FFT_CHUNK = 5000
#: share of the host's memory the footprint may add to the GPUs'
HOST_SHARE = 0.75
#: where no GPU sizes ``full`` (CPU workers): as for the issue's host, two H200s
NOMINAL_GPUS = (2, 2 * 141 * 10**9)


def footprint_factor(gpus: int, device_bytes: int | None = None, host_bytes: int | None = None) -> float:
    """The peak footprint over the GPUs' total memory at full size, at most what the
    GPUs and :data:`HOST_SHARE` of the host hold where both are known."""
    factor = FOOTPRINT_ONE_GPU if gpus <= 1 else FOOTPRINT_MANY_GPUS
    if device_bytes and host_bytes:
        factor = min(factor, 1 + HOST_SHARE * host_bytes / device_bytes)
    return factor


def panels(n: int, panel: int) -> dict:
    """A float64 n x n array in row panels, rechunked to column panels."""
    return {"shape": (n, n), "chunks": (panel, n), "dtype": "float64", "out_shape": (n, n),
            "to_chunks": (n, panel), "out_chunks": (n, panel), "panel": panel}


def squares(n: int, chunk: int, panel: int) -> dict:
    """A complex128 n x n array in square chunks, transformed along axis 0 in column panels."""
    return {"shape": (n, n), "chunks": (chunk, chunk), "dtype": "complex128", "out_shape": (n, n),
            "to_chunks": (n, panel), "out_chunks": (n, panel), "panel": panel}


def o3_full(device_bytes: int, gpus: int, host_bytes: int | None = None) -> dict:
    # input and output, float64 each
    n = side_for(footprint_factor(gpus, device_bytes, host_bytes) * device_bytes, arrays=2, itemsize=8, step=PANEL)
    return panels(n, PANEL)


def o4_full(device_bytes: int, gpus: int, host_bytes: int | None = None) -> dict:
    # input and output, complex128 each
    n = side_for(footprint_factor(gpus, device_bytes, host_bytes) * device_bytes, arrays=2, itemsize=16, step=PANEL)
    return squares(n, FFT_CHUNK, PANEL)


#: O5's footprint (input and output, float32) over the GPUs' memory at full size
FOOTPRINT_STENCIL = 1.3
#: the side of O5's cubic chunks (W5's)
STENCIL_CHUNK = 512


def cube(n: int, chunk: int) -> dict:
    """A float32 n^3 field in cubic chunks, filtered in place (same shape and chunks)."""
    return {"shape": (n,) * 3, "chunks": (chunk,) * 3, "dtype": "float32", "out_shape": (n,) * 3,
            "out_chunks": (chunk,) * 3}


def o5_full(device_bytes: int, gpus: int, host_bytes: int | None = None) -> dict:
    # input and output, float32 each, at 1.3x the GPUs (within the host's share)
    factor = FOOTPRINT_STENCIL
    if host_bytes:
        factor = min(factor, 1 + HOST_SHARE * host_bytes / device_bytes)
    n = int((factor * device_bytes / 2 / 4) ** (1 / 3)) // 64 * 64
    return cube(n, STENCIL_CHUNK)


def _o3_check(y):
    return y.sum(axis=0), y.sum(axis=1)


def _o3_reference(p, seed):
    from ..reference import column_and_row_sums

    return column_and_row_sums(p["shape"], seed, p["dtype"])


def _o4_check(big):
    # real**2 + imag**2 rather than abs()**2: no square root to round
    return big[0, :], (big.real ** 2 + big.imag ** 2).sum(axis=0)


def _o4_reference(p, seed):
    from ..reference import fft_axis0_checks

    return fft_axis0_checks(p["shape"], seed)


def _o5_check(y):
    # each plane's sum in float64: the reference's own precision, whatever the field's
    return (y.astype("float64").sum(axis=(1, 2)),)


def _o5_reference(p, seed):
    from ..reference import laplacian_plane_sums

    return (laplacian_plane_sums(p["shape"], seed, p["dtype"]),)


#: a baseline's failure is its result, not a failed bench: the row is there to time
#: spillway against what a user of plain dask-cuda meets, failures included
BASELINE_FAILURE = ("plain dask-cuda past the GPUs' memory, dask's default rechunk method: a failure is "
                    "its result (B5's P2P rechunk failed in its transfer phase on the GPU host)")

_COMMON = dict(
    workflow=None, sides=("spillway", "tasks_method", "baseline"), fresh_cluster=True, user_code=True,
    footprint=2, baseline_expected_failure=BASELINE_FAILURE,
)

O3 = Workload(
    name="O3", title="x.rechunk(row to column panels) as a user writes it, out of core",
    # full: sized from the machine; 1000-row panels to 1000-column panels (W3's)
    sizes={"full": o3_full(NOMINAL_GPUS[1], NOMINAL_GPUS[0]),
           "small": panels(60000, 1000),
           "tiny": panels(2000, 50)},
    direct=ex.rechunk_user, check=_o3_check, reference=_o3_reference, machine_sized=o3_full, **_COMMON,
)

O4 = Workload(
    name="O4", title="fft(x.rechunk({0: -1, 1: panel}), axis=0) as a user writes it, out of core",
    # full: sized from the machine; 5000^2 chunks to 1000-column panels (W4's)
    sizes={"full": o4_full(NOMINAL_GPUS[1], NOMINAL_GPUS[0]),
           "small": squares(40000, 5000, 1000),
           "tiny": squares(1024, 256, 64)},
    direct=ex.fft_user, check=_o4_check, reference=_o4_reference, machine_sized=o4_full, **_COMMON,
)

O5 = Workload(
    name="O5", title="x.map_overlap(3-D 7-point filter, depth 1) as a user writes it, out of core",
    # full: sized from the machine, 1.3x the GPUs; 512^3 chunks (W5's)
    sizes={"full": o5_full(NOMINAL_GPUS[1], NOMINAL_GPUS[0]),
           "small": cube(1024, 256),
           "tiny": cube(96, 32)},
    direct=ex.stencil_user, check=_o5_check, reference=_o5_reference, machine_sized=o5_full,
    side_direct={"tasks_method": ex.stencil_dask_halos},
    # the filter runs in float32 (each value rounded to about 6e-8 of itself): the planes'
    # sums in float64 then differ from the exact ones by a few parts in 10^8
    tolerance=1e-5,
    **{**_COMMON, "baseline_expected_failure": (
        "plain dask-cuda past the GPUs' memory: a failure (out of device memory) is its result")},
)

OUT_OF_CORE = (O3, O4, O5)
