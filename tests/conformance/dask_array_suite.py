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

#: the modules CI runs on both clusters (.ci/run, ``--conformance-shard ci``), with dask's
#: own ``slow``-marked tests left out (``-m "not slow"``, as dask's own runs leave them out
#: without ``--runslow``): rechunk, overlap, reshape and fft whole, and a share of slicing,
#: routines, reductions, array_core and linalg (:data:`CI_SHARES`); the rest of those by hand
#: (``--conformance-shard rest``: each test CI leaves out, once)
CI_MODULES = (
    "dask.array.tests.test_rechunk",
    "dask.array.tests.test_overlap",
    "dask.array.tests.test_reshape",
    "dask.array.tests.test_fft",
    "dask.array.tests.test_slicing",
    "dask.array.tests.test_routines",
    "dask.array.tests.test_reductions",
    "dask.array.tests.test_array_core",
    "dask.array.tests.test_linalg",
)

#: the modules CI runs a share of, to keep the step within CI's budget (2 cores): module -> N,
#: CI running the tests whose ids hash to shard 1 of N (the same tests in every run); shards
#: 2 to N are run by hand. With the four whole modules above, 793 tests took 314 s on the
#: control and 311 s on spillway (2026-12-06, a quiet 2-core machine), every failure on
#: spillway the control's too
CI_SHARES: dict = {"dask/array/tests/test_slicing.py": 2, "dask/array/tests/test_routines.py": 8,
                   "dask/array/tests/test_reductions.py": 16, "dask/array/tests/test_array_core.py": 8,
                   "dask/array/tests/test_linalg.py": 8}

#: modules too long to run by hand in one go: ``--conformance-shard K/N`` takes the tests
#: whose ids hash to K of N (the same split on every machine and in every run)
SHARDED = ("dask/array/tests/test_routines.py", "dask/array/tests/test_reductions.py",
           "dask/array/tests/test_array_core.py")

#: tests that fail on the control (plain distributed, no spillway), by shared id, or by a
#: test function's id alone (no ``[...]``) for each of its cases whose failure on the
#: control depends on the order keys are released in (which cases fail changes from run to
#: run): what each says about dask, distributed or this venv
CONTROL_FAILURES = {
    "dask/array/tests/test_rechunk.py::test_rechunk_intermediates":
        "with a distributed client the default, dask's rechunk takes its P2P method: one layer, "
        "fewer than the 30 tasks the test counts from intermediate steps",
    "dask/array/tests/test_routines.py::test_average_raises":
        "the division by zero warns in the worker's process, where pytest.warns does not see it",
    **{f"dask/array/tests/test_reductions.py::test_array_cumreduction_axis[blelloch-None-{nan}-{func}]":
       "expects cumprod's overflow RuntimeWarning in the test's process; NumPy emits it in the worker's, "
       "where pytest.warns does not see it" for nan in ("False", "True") for func in ("cumprod", "nancumprod")},
    "dask/array/tests/test_reductions.py::test_nanquantile_all_nan":
        "expects NumPy's RuntimeWarning raised as an error: dask's own pytest config makes warnings "
        "errors, this repository's does not (fails on dask's sync scheduler too)",
    "dask/array/tests/test_array_core.py::test_zarr_risky_shards_warns":
        "expects a PerformanceWarning raised as an error, as test_nanquantile_all_nan; past the warning, "
        "to_zarr refuses an in-memory Zarr store on the distributed scheduler",
    **{f"dask/array/tests/test_array_core.py::{test}":
       "stores into an in-memory Zarr array, which dask refuses on the distributed scheduler "
       "(RuntimeError: Cannot store into in memory Zarr Array)" for test in (
           "test_zarr_existing_array", "test_zarr_regions", "test_zarr_to_zarr_shards[None]",
           "test_zarr_to_zarr_shards[all]", "test_zarr_to_zarr_shards[half]")},
    **{f"dask/array/tests/test_array_core.py::{test}":
       "stores into a NumPy array of the test's process: each worker writes into its own unpickled "
       "copy, and the test's array keeps what it held" for test in (
           "test_store", "test_store_regions", "test_store_compute_false")},
    "dask/array/tests/test_array_core.py::test_store_delayed_target":
        "its delayed targets are made in the workers and recorded in the workers' copies of the test's "
        "dict: the test's own stays empty (KeyError 'at')",
    **{f"dask/array/tests/test_array_core.py::test_store_locks_count_calls[{v}]":
       "stores with a threading.Lock, which cannot be pickled to send to a worker" for v in ("False", "True")},
    **{f"dask/array/tests/test_array_core.py::test_from_array_with_lock[{v}]":
       "holds its SerializableLock in the test's process and expects compute to find it held; each worker "
       "unpickles a lock of its own, free, so nothing raises" for v in ("True", "False")},
    **{f"dask/array/tests/test_array_core.py::test_from_array_no_asarray[{v}]":
       "distributed's get returns the nested keys' results as lists where dask's local get returns "
       "tuples, so the test takes a row of chunks for a chunk" for v in (
           "True-True-ndarray", "True-False-matrix", "False-True-ndarray", "False-False-matrix")},
    **{f"dask/array/tests/test_array_core.py::test_from_array_getitem[{v}]":
       "its getitem sets a flag of the test's closure; the workers set their unpickled copies' flag"
       for v in ("True-True", "False-True")},
    "dask/array/tests/test_array_core.py::test_binary_operator_delegation":
        "needs pytest-mock's mocker fixture, which the test extra does not install",
}
#: dask's QR and SVD tests name their input ``da.from_array(..., name="A")`` in every case,
#: so that the keys of tsqr's graph (``qr-<token>``, ``getitem-<token>-r1``...) are the same
#: for inputs of other shapes and for the differently fused graphs one case computes in
#: turn; distributed keeps a key it still holds from the last graph ("Detected different
#: run_spec") and computes with the wrong blocks (shapes that do not align), where dask's
#: sync scheduler computes each graph afresh. Which cases fail depends on how fast the
#: scheduler forgets the last one's keys
_SHARED_KEY_NAMES = ("reuses the key names of its input named 'A' between graphs of other shapes "
                     "and fusings: distributed computes a key it still holds from the last graph")
CONTROL_FAILURES.update({f"dask/array/tests/test_linalg.py::{test}": _SHARED_KEY_NAMES for test in (
    "test_tsqr", "test_tsqr_uncertain", "test_sfqr", "test_qr", "test_dask_svd_self_consistent")})


#: tests run on neither cluster, by shared id: their failure on the control ends the test
#: process, and with it every outcome after theirs
NOT_RUN = {
    "dask/array/tests/test_array_core.py::test_memmap":
        "x.store(memmap) writes into the workers' unpickled copies, so assert_eq fails; the test's "
        "finally closes the memmap before pytest prints the failure's arguments, and reading the "
        "closed map segfaults the test process (on the control too)",
}


def varies_on_control(name: str) -> bool:
    """Whether the test of shared id ``name`` is one of a function :data:`CONTROL_FAILURES`
    names whole: whether it fails on the control changes from run to run, so its outcome
    there says nothing of spillway's."""
    return "[" in name and name.split("[")[0] in CONTROL_FAILURES


def control_failure(name: str) -> str | None:
    """Why the test of shared id ``name`` fails on the control, where
    :data:`CONTROL_FAILURES` names it or its test function; else None."""
    return CONTROL_FAILURES.get(name) or CONTROL_FAILURES.get(name.split("[")[0])


def shared_id(nodeid: str) -> str:
    """A test's id from ``dask/`` on: the same in every venv (pytest names a ``--pyargs``
    module by its path relative to the rootdir)."""
    at = nodeid.find("dask/array/tests/")
    return nodeid[at:] if at >= 0 else nodeid


def in_shard(name: str, shard: str) -> bool:
    """Whether the test of shared id ``name`` runs in shard ``"K/N"`` (tests of modules
    not in :data:`SHARDED` run in every shard), in CI's share (``"ci"``: shard 1 of N
    of the modules :data:`CI_SHARES` names, every test of the others), or in the rest
    (``"rest"``: every test CI's share leaves out, shards 2 to N of the modules
    :data:`CI_SHARES` names and none of the others; what is run by hand, each test once)."""
    module = name.split("::")[0]
    if shard == "rest":
        return not in_shard(name, "ci")
    if shard == "ci":
        k, n = 1, CI_SHARES.get(module, 1)
    else:
        k, n = (int(part) for part in shard.split("/"))
        if not 1 <= k <= n:
            raise ValueError(f"shard {shard}: K must be 1 to N")
        if module not in SHARDED:
            return True
    return n == 1 or zlib.crc32(name.encode()) % n == k - 1


if __name__ == "__main__":
    import sys

    print(" ".join(CI_MODULES if "--ci" in sys.argv[1:] else MODULES))
