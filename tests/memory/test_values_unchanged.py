"""The store never changes a value: dask-like task outputs (qr and svd tuples and the
getitem keys that take them apart, slices of other keys, small views of large
temporaries) moved between device, host and disk by every path the store has (limits,
spill on demand with inputs in use, prefetch, deletes), every live value compared bit for
bit with what was stored after every step. The CPU side of the conformance run of dask's
CuPy tests under forced spilling (benchmarks/gpu-host/conformance.sh)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy_codec import NumpyCodec
from tier_stacks import lowered, raised

from spillway.memory.arena import Arena
from spillway.memory.host import HostBuffers
from spillway.memory.store import TieredStore

KB = 2**10


def _qr(rng, rows, cols):
    """(Q, R) as CuPy's qr gives them: R a view of the workspace it was factored in."""
    workspace = rng.standard_normal((rows, cols))
    q = np.ascontiguousarray(workspace[:, ::-1])
    r = workspace[:cols]
    r[:] = np.triu(r)
    return q, r


def _svd(rng, rows, cols):
    u = rng.standard_normal((rows, cols))
    s = rng.random(cols)
    v = rng.standard_normal((cols, cols)).T  # F-ordered
    return u, s, v


def _same(got, expected):
    if isinstance(expected, (tuple, list)):
        assert type(got) is type(expected) and len(got) == len(expected)
        for g, e in zip(got, expected):
            _same(g, e)
    else:
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_value_survives_every_move(below, seed):
    rng = np.random.default_rng(seed)
    running: set = set()
    arena = HostBuffers(Arena(np.empty(256 * KB, dtype=np.uint8)))
    s = TieredStore(device_limit=512 * KB, host_limit=384 * KB, codec=NumpyCodec(),
                    below=below(), host=arena, in_use=lambda: running)
    expected: dict = {}  # key -> an independent copy of what was stored
    names = iter(range(10**6))

    def put(key, value):
        s[key] = value
        expected[key] = _copy(value)

    for step in range(200):
        op = int(rng.integers(0, 10))
        if op == 0:
            q, r = _qr(rng, int(rng.integers(64, 2048)), int(rng.integers(2, 16)))
            k = next(names)
            put(("qr", k), (q, r))
            put(("q", k), s[("qr", k)][0])
            put(("r", k), s[("qr", k)][1])
        elif op == 1:
            k = next(names)
            put(("svd", k), _svd(rng, int(rng.integers(32, 512)), int(rng.integers(2, 12))))
            for i in range(3):
                put(("svd-item", k, i), s[("svd", k)][i])
        elif op == 2:
            put(("x", next(names)), rng.standard_normal(int(rng.integers(1, 16 * KB))))
        elif op == 3 and expected:
            # a slice of another key's array (shares its allocation while both live)
            key = list(expected)[int(rng.integers(0, len(expected)))]
            base = s[key]
            base = base[0] if isinstance(base, tuple) else base
            put(("slice", next(names)), base[::2] if base.ndim == 1 else base[1:, ::2])
        elif op == 4:
            # a small view of a large temporary nobody stores
            put(("small-view", next(names)), rng.standard_normal(64 * KB)[10:20])
        elif op == 5 and expected:
            running.clear()
            running.update(list(expected)[i] for i in rng.integers(0, len(expected), 3))
            s.evict_for(int(rng.integers(16 * KB, 512 * KB)))
        elif op == 6:
            s.prefetch(s.spilled(expected)[:4])
        elif op == 7 and expected:
            key = list(expected)[int(rng.integers(0, len(expected)))]
            del s[key], expected[key]
        elif op == 8:
            running.clear()
        for key, value in expected.items():  # every value, after every step
            _same(s[key], value)
    moved = s.stats.bytes
    assert all(moved[m] for m in ("device_to_host", "host_to_device", lowered(s))) and raised(s), moved
    for key in list(expected):
        del s[key]
    assert s.device_bytes == 0 and s.host_bytes == 0 and s.below_bytes == 0
    assert s.host.arena.used_bytes == 0


def _copy(value):
    if isinstance(value, (tuple, list)):
        return type(value)(_copy(v) for v in value)
    return value.copy(order="K")
