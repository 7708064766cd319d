"""Which of dask's own array test modules the CPU conformance run takes
(:mod:`dask_array_conformance`), which of them run a shard at a time, and the tests that
fail on the control cluster too, each with its reason.

    python tests/conformance/dask_array_suite.py        # the modules, for --pyargs
    python tests/conformance/dask_array_suite.py --ci   # those CI runs (.ci/run)
"""

from __future__ import annotations

import zlib

#: dask's test modules whose graphs hold rechunks and overlaps, or that compute much
MODULES = (
    "dask.array.tests.test_rechunk",
    "dask.array.tests.test_overlap",
    "dask.array.tests.test_reshape",
    "dask.array.tests.test_routines",
    "dask.array.tests.test_fft",
    "dask.array.tests.test_linalg",
    "dask.array.tests.test_slicing",
    "dask.array.tests.test_reductions",
    "dask.array.tests.test_array_core",
)

#: the modules CI runs on both clusters: those whose graphs hold users' rechunks and halos,
#: run whole on the control and on spillway before they were put in CI (about 1.5 min each
#: on the 2-core machine); routines, slicing, reductions and array_core are run by hand
#: until their control failures are all named and their time fits CI's budget
CI_MODULES = (
    "dask.array.tests.test_rechunk",
    "dask.array.tests.test_overlap",
    "dask.array.tests.test_reshape",
    "dask.array.tests.test_fft",
)

#: modules too long for CI's budget in one run: ``--conformance-shard K/N`` takes the tests
#: whose ids hash to K of N (the same split on every machine and in every run)
SHARDED = ("dask/array/tests/test_routines.py", "dask/array/tests/test_reductions.py",
           "dask/array/tests/test_array_core.py")

#: tests that fail on the control (plain distributed, no spillway), by shared id: what
#: each says about dask, distributed or this venv
CONTROL_FAILURES = {
    "dask/array/tests/test_rechunk.py::test_rechunk_intermediates":
        "with a distributed client the default, dask's rechunk takes its P2P method: one layer, "
        "fewer than the 30 tasks the test counts from intermediate steps",
    "dask/array/tests/test_routines.py::test_average_raises":
        "the division by zero warns in the worker's process, where pytest.warns does not see it",
    "dask/array/tests/test_reductions.py::test_nanquantile_all_nan":
        "expects NumPy's RuntimeWarning raised as an error: dask's own pytest config makes warnings "
        "errors, this repository's does not (fails on dask's sync scheduler too)",
    "dask/array/tests/test_array_core.py::test_zarr_risky_shards_warns":
        "expects a PerformanceWarning raised as an error, as test_nanquantile_all_nan",
    "dask/array/tests/test_array_core.py::test_binary_operator_delegation":
        "needs pytest-mock's mocker fixture, which the test extra does not install",
}


def shared_id(nodeid: str) -> str:
    """A test's id from ``dask/`` on: the same in every venv (pytest names a ``--pyargs``
    module by its path relative to the rootdir)."""
    at = nodeid.find("dask/array/tests/")
    return nodeid[at:] if at >= 0 else nodeid


def in_shard(name: str, shard: str) -> bool:
    """Whether the test of shared id ``name`` runs in shard ``"K/N"``; tests of modules
    not in :data:`SHARDED` run in every shard."""
    k, n = (int(part) for part in shard.split("/"))
    if not 1 <= k <= n:
        raise ValueError(f"shard {shard}: K must be 1 to N")
    if n == 1 or name.split("::")[0] not in SHARDED:
        return True
    return zlib.crc32(name.encode()) % n == k - 1


if __name__ == "__main__":
    import sys

    print(" ".join(CI_MODULES if "--ci" in sys.argv[1:] else MODULES))
