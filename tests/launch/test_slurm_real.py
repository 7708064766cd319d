"""Batch analyses on a real one-node Slurm: a CPU job submitted through
``spillway slurm submit`` computes transpose-sum, and a cancelled job leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from reference_inputs import uniform_numpy
from spillway.workflows.workflow import relative_error

pytestmark = pytest.mark.slow

JOB_TIMEOUT_S = 180


def spillway(cluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spillway", *args], env=cluster.env, capture_output=True,
                          text=True, timeout=timeout)


def submit(cluster, out: Path, *params: str, then: list | None = None) -> str:
    args = ["slurm", "submit", "transpose-sum", "--nodes", "1", "--gpus-per-node", "0", "--cpu",
            "--n-workers", "2", "--time", "00:05:00", "--output-dir", str(out), "--dashboard-address", "none"]
    for p in params:
        args += ["--param", p]
    if then:
        args += ["--then", json.dumps(then)]
    done = spillway(cluster, *args)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert job_id.isdigit(), done.stdout
    return job_id


def status(cluster, job_id: str) -> dict:
    done = spillway(cluster, "slurm", "status", job_id, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def wait_until_done(cluster, job_id: str, timeout: float = JOB_TIMEOUT_S) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = status(cluster, job_id)
        if not found["active"]:
            return found
        time.sleep(1)
    pytest.fail(f"job {job_id} still active after {timeout}s: {found}")


def job_processes(cluster, job_id: str) -> list[str]:
    """Processes whose environment says they belong to the job (its steps' children too)
    on this test's Slurm (job ids of another Slurm on the machine may be the same)."""
    markers = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURM_CONF={cluster.conf}".encode()}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if markers <= set((proc / "environ").read_bytes().split(b"\0")):
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name}: {command[:200]}")
        except OSError:
            continue
    return found


def assert_nothing_left(cluster, job_id: str, timeout: float = 15):
    deadline = time.monotonic() + timeout
    while (left := job_processes(cluster, job_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], left


def job_files(out: Path, job_id: str) -> str:
    texts = []
    for path in [out / f"spillway-{job_id}.out", *sorted((out / f"spillway-{job_id}").glob("*.log"))]:
        if path.exists():
            texts.append(f"--- {path.name}\n{path.read_text()[-3000:]}")
    return "\n".join(texts)


def test_batch_analysis_writes_a_report_that_matches_numpy(slurm_cluster, tmp_path):
    second = {"workflow": "transpose-sum", "params": {"size": "600x600", "chunks": "300x300", "seed": 3}}
    job_id = submit(slurm_cluster, tmp_path, "size=1200x1200", "chunks=400x400", "seed=7", then=[second])
    found = wait_until_done(slurm_cluster, job_id)
    assert found["state"] == "COMPLETED", job_files(tmp_path, job_id)

    results = tmp_path / f"spillway-{job_id}"
    for name, shape, seed in (("01-transpose-sum", (1200, 1200), 7), ("02-transpose-sum", (600, 600), 3)):
        report = json.loads((results / f"{name}.json").read_text())
        x = uniform_numpy(shape, seed=seed, dtype="float64").astype(np.float64)
        reference = (x + x.T).sum()
        assert relative_error(np.float64(report["result"]["sum"]), reference) <= 1e-10, name
        assert report["verify"]["ok"] is True
        assert report["cluster"] == {"kind": "cpu", "n_workers": 2, "protocol": "tcp"}
    assert (results / "job.sbatch").read_text().startswith("#!/usr/bin/env bash")
    output = (tmp_path / f"spillway-{job_id}.out").read_text()
    assert "2 workers up" in output and "finished with status 0" in output
    assert_nothing_left(slurm_cluster, job_id)


def test_cancelled_job_leaves_nothing_running(slurm_cluster, tmp_path):
    # large enough that the workflow is still computing when the job is cancelled
    job_id = submit(slurm_cluster, tmp_path, "size=20000x20000", "chunks=1000x1000")
    results = tmp_path / f"spillway-{job_id}"
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not (results / "01-transpose-sum.log").exists():
        assert time.monotonic() < deadline, job_files(tmp_path, job_id)
        assert status(slurm_cluster, job_id)["active"], job_files(tmp_path, job_id)
        time.sleep(0.5)
    time.sleep(1)
    assert job_processes(slurm_cluster, job_id), "the job's scheduler and workers should be running"

    done = spillway(slurm_cluster, "slurm", "cancel", job_id)
    assert done.returncode == 0 and done.stdout.strip() == f"cancelled {job_id}", done.stderr
    found = wait_until_done(slurm_cluster, job_id, timeout=60)
    assert found["state"] == "CANCELLED"
    assert_nothing_left(slurm_cluster, job_id)
    assert slurm_cluster.run("squeue", "-h", "-j", job_id).stdout.strip() == ""
    assert "status 143" in (tmp_path / f"spillway-{job_id}.out").read_text()
    assert not (results / "01-transpose-sum.json").read_text().strip()
