"""spillway.slurm() on a real one-node Slurm (munged, slurmctld and slurmd on loopback, the
``slurm_cluster`` fixture): a notebook's cluster of Slurm jobs scales to 2 jobs, runs
transpose-sum checked against NumPy, adapts back to none and closes with no job and no
process left; a job that fails is said in one line. The job scripts are checked as text,
a GPU node's too (rendered only)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("dask_jobqueue")

import spillway  # noqa: E402
from spillway.options.errors import ClusterStartError, OptionsError  # noqa: E402

pytestmark = pytest.mark.slow


def squeue(slurm) -> list[str]:
    return [line for line in slurm.run("squeue", "-h", "-o", "%i %T %j").stdout.splitlines() if line.strip()]


def job_processes(conf: Path) -> list[str]:
    """Processes of a job of this test's Slurm (their environment names its config)."""
    marker = f"SLURM_CONF={conf}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                env = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker in env and any(e.startswith(b"SLURM_JOB_ID=") for e in env):
                found.append(proc.name)
    return found


def until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.2)


@pytest.fixture
def on_slurm(slurm_cluster, monkeypatch):
    # sbatch, squeue and scancel find this test's Slurm by its config
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    return slurm_cluster


@pytest.mark.timeout(300)
def test_scale_run_adapt_and_close_on_real_slurm(on_slurm, tmp_path):
    cluster = spillway.slurm(cpu=True, n_workers=1, dashboard_address=None, time="00:05:00", cpus_per_task=1,
                             output_dir=str(tmp_path / "out"), job_name="spillway-test")
    try:
        script = cluster.job_script()
        assert "#SBATCH --job-name=spillway-test" in script and "#SBATCH --cpus-per-task=1" in script
        assert "#SBATCH --mem" not in script  # Slurm's default: this node declares 1 MB
        assert f"#SBATCH --output={tmp_path / 'out'}/spillway-%j.out" in script
        assert "export DASK_DISTRIBUTED__WORKER__LIFETIME__DURATION=240s" in script
        command = script.strip().splitlines()[-1]
        assert command.startswith(f"exec {sys.executable} -m distributed.cli.dask_worker tcp://127.0.0.1:")
        assert "--name dummy-name --protocol tcp --nworkers 1 --nthreads 1" in command

        cluster.scale(jobs=2)
        cluster.wait_for_workers(2, timeout=120)
        assert len(squeue(on_slurm)) == 2 and cluster.n_workers == 2
        report = cluster.run("transpose-sum", size="1200x1200", chunks="400x400", seed=7, verify=True,
                             progress=False)
        assert report["verify"]["ok"] is True and report["cluster"]["n_workers"] == 2
        # spillway's worker plugin reached the jobs' workers, registered before any joined
        assert all(cluster.client.run(lambda dask_worker: "spillway-setup" in dask_worker.plugins).values())
        # a user's own rechunk takes the collective on the jobs' workers, as on spillway.local()
        import dask.array as da
        import numpy as np

        x = da.random.default_rng(3).random((400, 300), chunks=(50, 300)).persist()
        y = x.rechunk((400, 30))
        assert any(name.startswith(("spillway-cut-", "spillway-step-")) for name in y.dask.layers)
        assert np.array_equal(y.compute(), x.compute())
        # and its map_overlap's halos the exchange (along every axis: a halo along one is
        # few pieces a chunk, which stays dask's own, as small grids do)
        w = da.random.default_rng(4).random((40, 40, 40), chunks=10).persist()
        z = w.map_overlap(lambda b: np.roll(b, 1, 0) + b, depth=1, boundary="periodic")
        assert any(name.startswith(("spillway-cut-", "spillway-step-")) for name in z.dask.layers)
        assert np.array_equal(z.compute(), np.roll(w.compute(), 1, 0) + w.compute())
        del x, y, w, z

        cluster.adapt(minimum_jobs=0, maximum_jobs=2, interval="500ms", wait_count=2)
        until(lambda: cluster.n_workers == 0, 60, "adapt to no worker")
        until(lambda: not squeue(on_slurm), 60, "no job after adapting to none")
    finally:
        cluster.close()
    until(lambda: not squeue(on_slurm), 60, "no job after close")
    until(lambda: not job_processes(on_slurm.conf), 30, "no process of a job after close")


@pytest.mark.timeout(180)
def test_a_job_that_fails_is_said_in_one_line(on_slurm, tmp_path):
    out = tmp_path / "out"
    with spillway.slurm(cpu=True, n_workers=1, dashboard_address=None, time="00:05:00", cpus_per_task=1,
                        output_dir=str(out), python="/no/such/python") as cluster:
        cluster.scale(jobs=1)
        with pytest.raises(ClusterStartError) as failed:
            cluster.wait_for_workers(1, timeout=60)
    message = str(failed.value)
    assert "\n" not in message and "ended before its workers joined: FAILED" in message, message
    assert f"see {out}/spillway-" in message
    until(lambda: not squeue(on_slurm), 60, "no job after close")


def test_a_gpu_nodes_job_runs_spillway_worker_named_for_its_job(tmp_path):
    """Rendered only (no sbatch): 4 GPUs, 2 workers each, one job."""
    with spillway.slurm(gpus_per_node=4, workers_per_gpu=2, protocol="tcp", dashboard_address=None,
                        time="01:00:00", partition="gpu", mem="500G", output_dir=str(tmp_path)) as cluster:
        script = cluster.job_script()
        assert cluster.workers_per_job == 8 and cluster.jobs.worker_spec == {}
    assert "#SBATCH --gpus-per-node=4" in script and "#SBATCH --partition=gpu" in script
    assert "#SBATCH --mem=500G" in script and "#SBATCH --cpus-per-task=16" in script
    command = script.strip().splitlines()[-1]
    assert f"exec {sys.executable} -m spillway worker --scheduler-address tcp://" in command
    assert "--name dummy-name" in command and "--workers-per-gpu 2" in command and "--memory-store tiered" in command


def test_settings_that_cannot_work_are_refused_before_anything_is_submitted(tmp_path):
    for keywords, says in (({"cpu": True, "time": "00:01:00"}, "time: 00:01:00 is shorter"),
                           ({"cpu": True, "scheduler_file": "s.json"}, "scheduler-address/scheduler-file"),
                           ({"gpus_per_node": 2}, "protocol: the jobs' workers talk ucx")):
        with pytest.raises(OptionsError) as refused:
            spillway.slurm(output_dir=str(tmp_path), dashboard_address=None, **keywords)
        assert str(refused.value).startswith(says) and "\n" not in str(refused.value), str(refused.value)
    with spillway.slurm(cpu=True, dashboard_address=None, output_dir=str(tmp_path)) as cluster:
        for call, says in ((lambda: cluster.scale(), "scale: give n (workers) or jobs"),
                           (lambda: cluster.scale(jobs=-1), "jobs: -1 must be an integer >= 0"),
                           (lambda: cluster.adapt(minimum_jobs=0), "maximum_jobs: give the most jobs"),
                           (lambda: cluster.adapt(minimum_jobs=2, maximum_jobs=1), "minimum_jobs: 2 is above")):
            with pytest.raises(OptionsError) as refused:
                call()
            assert str(refused.value).startswith(says), str(refused.value)
