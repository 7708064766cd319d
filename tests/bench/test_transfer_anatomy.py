"""The transfer anatomy probe (``python -m spillway_bench.transfer_anatomy``): its CPU
stand-in (``tcp://``, NumPy) runs here, so the code the GPU host runs is exercised; the GPU
rows (ucxx, CuPy, two spillway workers of one GPU) are marked gpu."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spillway_bench import transfer_anatomy as anatomy

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20


def _probe(tmp_path, *args, timeout=240) -> dict:
    out = tmp_path / "anatomy.json"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "spillway_bench.transfer_anatomy", *args, "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    assert "transfer anatomy" in done.stdout  # the short table, printed last
    return json.loads(out.read_text())


def test_cpu_stand_in_times_each_layer(tmp_path):
    # 16 MiB is above distributed's offload threshold (10 MiB), 64 KiB below it
    result = _probe(tmp_path, "--cpu", "--sizes", "64KiB,16MiB", "--repeats", "2")
    assert result["scheme"] == "tcp" and result["module"] == "numpy"
    assert set(result["rows"]) == set(anatomy.CPU_ROWS)
    for name, row in result["rows"].items():
        assert "error" not in row, (name, row)
        assert [s["bytes"] for s in row["summary"]] == [64 * 1024, 16 * MiB]
        for s in row["summary"]:
            assert s["same_bits"] and s["repeats"] == 2
            # every step was timed (how long each took is the bench's to say, not a test's)
            assert s["ms"]["total"] > 0
            # (a difference of two processes' clocks, "receiver stop - sender stop", may be negative)
            assert all(ms is None or isinstance(ms, (int, float)) for ms in s["ms"].values()), (name, s["ms"])
    comm = {s["bytes"]: s for s in result["rows"]["comm"]["summary"]}
    no_offload = {s["bytes"]: s for s in result["rows"]["comm-no-offload"]["summary"]}
    # distributed hands (de)serialization of a message over the threshold to its offload
    # thread, and the row that raises the threshold keeps it on the event loop
    assert comm[16 * MiB]["threads"] == {"dumps": ["Dask-Offload_0"], "loads": ["Dask-Offload_0"]}
    assert comm[64 * 1024]["threads"] == {"dumps": ["MainThread"], "loads": ["MainThread"]}
    assert no_offload[16 * MiB]["threads"] == {"dumps": ["MainThread"], "loads": ["MainThread"]}
    for s in comm.values():
        assert s["ms"]["request"] > 0 and s["ms"]["wire"] > 0 and s["ms"]["sender to_frames"] > 0
        assert s["ms"]["sender to_frames: dumps"] <= s["ms"]["sender to_frames"]
    workers = {s["bytes"]: s for s in result["rows"]["workers"]["summary"]}
    for s in workers.values():
        # the receiver's gather is in its own books, split by distributed's context_meter
        assert s["ms"]["receiver gather-dep/network/seconds"] > 0
        assert s["ms"]["sender get-data/serialize/seconds"] > 0
        assert s["ms"]["request"] > 0 and s["ms"]["sender: write + OK read"] > 0


def test_bad_rows_and_repeats_are_refused(tmp_path):
    for args, says in ((["--rows", "comm,bogus"], "'bogus' is not one of"), (["--repeats", "0"], "below the minimum")):
        done = subprocess.run([sys.executable, "-m", "spillway_bench.transfer_anatomy", "--cpu", *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 2 and says in done.stderr, done.stderr


def test_summary_takes_medians_of_timed_transfers_only():
    steps = [{"bytes": 8, "warm_up": True, "same_bits": True, "total": 100.0},
             *({"bytes": 8, "warm_up": False, "same_bits": True, "total": t, "wire": t / 2} for t in (1.0, 3.0, 2.0))]
    [s] = anatomy.summarize(steps)
    assert s["ms"] == {"total": 2.0, "wire": 1.0} and s["repeats"] == 3 and s["same_bits"]


@pytest.mark.gpu
def test_gpu_rows_move_chunks_bit_for_bit(tmp_path):
    from spillway.launch.plan import ucxx_installed

    if not ucxx_installed():
        pytest.skip("distributed-ucxx is not installed")
    result = _probe(tmp_path, "--sizes", "16MiB", "--repeats", "2", timeout=420)
    assert set(result["rows"]) == set(anatomy.GPU_ROWS)
    for name, row in result["rows"].items():
        assert "error" not in row, (name, row)
        [s] = row["summary"]
        assert s["same_bits"] and s["ms"]["total"] > 0
