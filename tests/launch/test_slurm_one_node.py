"""The rendered one-node batch script on a machine without Slurm: spillway's ``srun``
stand-in runs each step here as a one-node allocation would, so the script's own
scheduler, CPU workers (with the flags rendered from the options) and workflow step run,
and the workflow's verified report is checked against NumPy. The stand-in refuses the
steps it cannot run faithfully."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from reference_inputs import uniform_numpy
from spillway.launch.slurm_batch import JobSettings, Run, install_srun, job_script, run_script
from spillway.options.settings import Options
from spillway.workflows.workflow import relative_error


def _srun(tmp_path, *args):
    srun = install_srun(tmp_path / "bin")
    return subprocess.run([str(srun), *args], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7"})


def test_the_stand_in_runs_a_one_node_step_and_refuses_others(tmp_path):
    ok = _srun(tmp_path, "--overlap", "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=2", "--cpu-bind=none",
               "bash", "-c", 'echo "$SLURM_NNODES $SLURM_NTASKS $SLURM_PROCID $SLURM_CPUS_PER_TASK $SLURM_JOB_ID"')
    assert ok.returncode == 0 and ok.stdout.split() == ["1", "1", "0", "2", "7"], ok.stderr
    assert _srun(tmp_path, "-N", "1", "-n", "1", "true").returncode == 0
    two = _srun(tmp_path, "--nodes=2", "true")
    assert two.returncode == 2 and "--nodes=2: this stand-in runs one node" in two.stderr
    tasks = _srun(tmp_path, "--ntasks=4", "true")
    assert tasks.returncode == 2 and "4 tasks" in tasks.stderr
    odd = _srun(tmp_path, "--gres=gpu:1", "true")
    assert odd.returncode == 2 and "--gres=gpu:1 is not an option this stand-in knows" in odd.stderr
    # the command's own exit status comes back
    assert _srun(tmp_path, "--overlap", "bash", "-c", "exit 5").returncode == 5


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_cpu_script_runs_here_and_verifies(tmp_path):
    shape, seed = (600, 600), 5
    job = JobSettings(nodes=1, gpus_per_node=0, time="00:10:00", output_dir=str(tmp_path), python=sys.executable,
                      start_timeout=120)
    options = Options.resolve(cpu=True, n_workers=2, dashboard_address=None)
    text = job_script(options, job, [Run("transpose-sum", {"size": f"{shape[0]}x{shape[1]}", "chunks": "200x200",
                                                           "seed": seed})])
    run = run_script(text, tmp_path, job_id="5150", timeout=240)
    assert run.returncode == 0 and not run.timed_out, run.output[-3000:] + run.log(1, "transpose-sum")[-3000:]
    assert "spillway: job 5150 finished with status 0" in run.output
    report = run.report(1, "transpose-sum")
    assert report["cluster"]["kind"] == "cpu" and report["cluster"]["n_workers"] == 2
    assert report["verify"]["ok"] is True
    x = uniform_numpy(shape, seed=seed, dtype="float64").astype(np.float64)
    assert relative_error(np.float64(report["result"]["sum"]), (x + x.T).sum()) <= 1e-10
    # the job's scheduler and workers stopped with it
    left = subprocess.run(["pgrep", "-f", str(run.results)], capture_output=True, text=True).stdout.split()
    assert left == [], left
