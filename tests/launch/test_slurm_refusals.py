"""spillway.slurm() where Slurm cannot take a job: no sbatch, a Slurm client without its
controller, and a job sbatch refuses. Each is one line at ``scale()`` (or ``adapt()``),
naming the command and what it said, before any wait; ``close()`` then returns cleanly.
The commands are small stand-in scripts on the PATH (no Slurm is needed)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

pytest.importorskip("dask_jobqueue")

import spillway  # noqa: E402
from spillway.options.errors import ClusterStartError  # noqa: E402
from spillway.launch.slurm_batch import SlurmError  # noqa: E402
from spillway.launch.slurm_jobs import refusal_line  # noqa: E402

NO_CONTROLLER = "sbatch: fatal: Could not establish a configuration source"


def stand_ins(bin_dir: Path, **scripts: str) -> None:
    """Executable shell scripts named by the keywords, on ``bin_dir``."""
    bin_dir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def path_of(tmp_path, monkeypatch):
    """``tmp_path/bin``, for stand-ins of Slurm's commands."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # first on the PATH: a machine's own Slurm client (CI installs one) never answers for them
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"]))
    return bin_dir


def cluster(tmp_path):
    return spillway.slurm(cpu=True, protocol="tcp", dashboard_address=None, output_dir=str(tmp_path / "out"))


def one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message, message
    return message


def test_without_sbatch_scale_says_so_in_one_line_and_close_returns(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    c = cluster(tmp_path)
    with pytest.raises(SlurmError) as refused:
        c.scale(jobs=1)
    assert one_line(refused.value) == "sbatch: not found on the PATH; run this on a Slurm login node"
    with pytest.raises(SlurmError):
        c.adapt(minimum_jobs=0, maximum_jobs=2)
    assert c.jobs.worker_spec == {}
    c.close()
    # as a keyword of slurm() too: the cluster it started is closed before the line is raised
    with pytest.raises(SlurmError, match="^sbatch: not found"):
        spillway.slurm(cpu=True, protocol="tcp", dashboard_address=None, output_dir=str(tmp_path / "out"), jobs=1)


def test_without_sbatch_a_cluster_of_default_gpu_jobs_names_sbatch_first(tmp_path, monkeypatch):
    """No gpus_per_node and no cpu: the missing batch system is the cause, and scale() says
    it, rather than the cluster stopping on a job setting before Slurm is ever asked."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    c = spillway.slurm(protocol="tcp", dashboard_address=None, output_dir=str(tmp_path / "out"))
    try:
        assert "#SBATCH --gpus-per-node=1" in c.job_script() and c.workers_per_job == 1
        with pytest.raises(SlurmError) as refused:
            c.scale(jobs=1)
        assert one_line(refused.value) == "sbatch: not found on the PATH; run this on a Slurm login node"
        assert c.jobs.worker_spec == {} and c.jobs.workers == {}
    finally:
        c.close()
    assert c.jobs.status.name == "closed"
    with pytest.raises(SlurmError, match="^sbatch: not found"):
        spillway.slurm(protocol="tcp", dashboard_address=None, output_dir=str(tmp_path / "out"), jobs=1)


def test_a_slurm_client_without_its_controller_is_said_at_scale(tmp_path, path_of):
    stand_ins(path_of, sbatch='[ "$1" = --version ] && { echo "slurm 23.11.4"; exit 0; }\n'
                              f'echo "{NO_CONTROLLER}" >&2; exit 1',
              sinfo=f'echo "{NO_CONTROLLER.replace("sbatch", "sinfo")}" >&2; exit 1',
              squeue="exit 1", scancel="exit 0")
    with cluster(tmp_path) as c:
        with pytest.raises(SlurmError) as refused:
            c.scale(jobs=2)
        assert one_line(refused.value) == (
            "Slurm does not answer here: sinfo failed (exit 1): "
            "sinfo: fatal: Could not establish a configuration source")
        assert c.jobs.worker_spec == {}


def test_a_job_sbatch_refuses_is_said_at_once_and_leaves_the_spec(tmp_path, path_of):
    calls = tmp_path / "sbatch-calls"
    stand_ins(path_of, sbatch=f'echo "$@" >> {calls}\n[ "$1" = --version ] && {{ echo "slurm 23.11.4"; exit 0; }}\n'
                              'echo "sbatch: error: Batch job submission failed: Invalid account" >&2; exit 1',
              sinfo="echo debug", squeue="exit 0", scancel="exit 0")
    with cluster(tmp_path) as c:
        with pytest.raises(ClusterStartError) as refused:
            c.scale(jobs=2)
        assert one_line(refused.value) == ("sbatch refused the job (exit 1): sbatch: error: Batch job submission "
                                           "failed: Invalid account (and 1 more job(s) refused)")
        # refused jobs are neither counted nor waited for
        assert c.jobs.worker_spec == {} and c.jobs.workers == {}
        assert calls.read_text().count("--version") == 1  # the check runs once per cluster
    assert len(calls.read_text().splitlines()) == 3


def test_refusal_line_reads_dask_jobqueues_error():
    error = RuntimeError("Command exited with non-zero exit code.\nExit code: 1\nCommand:\nsbatch /tmp/x.sh\n"
                         "stdout:\n\nstderr:\nsbatch: error: one\nsbatch: error: the last\n\n")
    assert refusal_line("sbatch", error) == "sbatch refused the job (exit 1): sbatch: error: the last"
    assert refusal_line("sbatch", FileNotFoundError(2, "No such file or directory")) == (
        "sbatch did not take the job: FileNotFoundError: [Errno 2] No such file or directory")
