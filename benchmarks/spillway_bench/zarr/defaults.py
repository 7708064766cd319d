"""The data of issue 29's stores as users write them (float32 days x lat x lon), which the
Zarr decode tests read back: a smooth seasonal field plus noise, and uniform numbers. The
round that measured those stores is in ``benchmarks/results/*-s7-zarr-defaults.*`` and
``*-zarr-decode-rates-*``."""

from __future__ import annotations

import numpy as np


def field_block(t0: int, t1: int, nlat: int, nlon: int) -> np.ndarray:
    """Days t0..t1 of a smooth seasonal 2 m temperature plus noise, to 0.01 K (about 2x
    with zstd)."""
    doy = (np.arange(t0, t1) % 365)[:, None, None].astype(np.float32)
    phi = np.deg2rad(np.linspace(90, -90, nlat, dtype=np.float32))[None, :, None]
    lam = np.deg2rad(np.linspace(0, 360, nlon, endpoint=False, dtype=np.float32))[None, None, :]
    season = np.cos(2 * np.pi * (doy - 200) / 365.25)
    smooth = 253 + 45 * np.cos(phi) + 15 * np.sin(phi) * season + 3 * np.sin(2 * lam) * np.cos(phi)
    noise = np.random.default_rng(t0).standard_normal((t1 - t0, nlat, nlon), dtype=np.float32)
    return np.round(smooth + 0.5 * noise, 2).astype(np.float32)


def random_block(t0: int, t1: int, nlat: int, nlon: int) -> np.ndarray:
    """Uniform numbers (about 1.1x with zstd: it stores the mantissas mostly raw)."""
    return np.random.default_rng(10_000 + t0).random((t1 - t0, nlat, nlon), dtype=np.float32)
