"""The rendered GPU batch script on a GPU machine without Slurm: a stand-in ``srun`` runs
each step on this node, so the script's own commands (``dask scheduler``, ``spillway
worker`` with the flags rendered from the options, ``spillway run``) start real GPU
workers, one per GPU, and the report is checked against NumPy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from reference_inputs import uniform_numpy
from spillway.launch.slurm_batch import JobSettings, Run, install_srun, job_script
from spillway.options.settings import Options
from spillway.workflows.workflow import relative_error

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

def _fake_slurm(tmp_path: Path) -> dict:
    """The environment of a one-node job: spillway's srun stand-in first on PATH."""
    bin_dir = tmp_path / "bin"
    install_srun(bin_dir)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NUM_NODES": "1"}


def _run_script(tmp_path: Path, text: str, env: dict, timeout: float = 400) -> subprocess.CompletedProcess:
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    proc = subprocess.Popen(["bash", str(script)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"batch script did not finish in {timeout}s:\n{out[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def test_gpu_script_runs_one_worker_per_gpu(tmp_path, gpu_count):
    shape, seed = (8000, 8000), 11
    job = JobSettings(nodes=1, gpus_per_node=gpu_count, time="00:30:00", output_dir=str(tmp_path),
                      python=sys.executable, start_timeout=240)
    options = Options.resolve(rmm_pool_size="2GB", dashboard_address=None)
    text = job_script(options, job, [Run("transpose-sum", {"size": f"{shape[0]}x{shape[1]}",
                                                           "chunks": "2000x2000", "seed": seed})])
    done = _run_script(tmp_path, text, _fake_slurm(tmp_path))
    results = tmp_path / "spillway-4242"
    logs = "\n".join(p.read_text()[-3000:] for p in results.glob("*.log"))
    assert done.returncode == 0, done.stdout[-3000:] + logs

    report = json.loads((results / "01-transpose-sum.json").read_text())
    assert report["cluster"]["kind"] == "gpu" and report["cluster"]["n_workers"] == gpu_count
    assert report["cluster"]["protocol"] == ("ucx" if gpu_count > 1 else "tcp")
    x = uniform_numpy(shape, seed=seed, dtype="float64").astype(np.float64)
    assert relative_error(np.float64(report["result"]["sum"]), (x + x.T).sum()) <= 1e-10
    assert report["verify"]["ok"] is True
    # `spillway worker` gave every worker the tiered store (its spill counters are in the report),
    # and UCX started before the store made a CUDA context
    assert report["spill"] is not None and len(report["spill"]) == gpu_count
    workers_log = (results / "workers.log").read_text()
    assert "A CUDA context for device" not in workers_log and "unused environment variable" not in workers_log
    # the trap stopped the scheduler and workers on exit
    time.sleep(2)
    left = subprocess.run(["pgrep", "-f", str(results)], capture_output=True, text=True).stdout.split()
    assert left == [], left


def test_cpu_affinity_failure_is_a_warning():
    """dask-cuda's CPU-affinity plugin, which every `dask cuda worker` runs, logs a
    warning when the cores of its GPU are outside the job's CPU set (a partial-node
    allocation) instead of failing the worker."""
    import logging

    from dask_cuda.plugins import CPUAffinity

    records: list[logging.LogRecord] = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = records.append
    # distributed's loggers may not propagate to the root logger, so listen on it directly
    logger = logging.getLogger("distributed.worker")
    logger.addHandler(handler)
    before = os.sched_getaffinity(0)
    try:
        CPUAffinity([(os.cpu_count() or 1) + 4096]).setup()
    finally:
        logger.removeHandler(handler)
    assert os.sched_getaffinity(0) == before
    assert any("Setting CPU affinity for GPU failed" in r.getMessage() for r in records)
