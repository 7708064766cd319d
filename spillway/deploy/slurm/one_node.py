"""Running a rendered one-node batch script on a machine without Slurm.

The script's steps call ``srun``; the stand-in next to this file (``srun``, a short bash
script) runs each step's command on this machine as a one-node allocation would, and
refuses a step for more nodes or tasks. :func:`run_script` puts it first on ``PATH``,
sets what ``sbatch`` would (``SLURM_JOB_ID``, ``SLURM_SUBMIT_DIR``), writes the job's
output file where its ``--output`` directive says, and stops every process the script
left behind when it ends or runs out of time. Used by the matrix's ``batch`` path and
``benchmarks/gpu-host/batch-gpu.sh``; Slurm itself stays tested where it runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SRUN = Path(__file__).with_name("srun")


def install_srun(bin_dir: str | os.PathLike) -> Path:
    """The stand-in copied into ``bin_dir`` as an executable ``srun`` (installed packages
    do not always keep the file's executable bit)."""
    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    target = bin_dir / "srun"
    shutil.copyfile(SRUN, target)
    target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return target


@dataclass
class BatchRun:
    returncode: int | None
    #: the job's output file (``--output``), what sbatch would have written
    output: str
    #: the job's results folder (``OUTPUT_DIR/spillway-JOBID``): reports and logs
    results: Path
    timed_out: bool = False

    def report(self, index: int, workflow: str) -> dict | None:
        """The JSON report of the ``index``-th (1-based) workflow, None when it wrote none."""
        for path in sorted(self.results.glob(f"{index:02d}-{workflow}.json")):
            text = path.read_text().strip()
            if text:
                return json.loads(text.splitlines()[-1])
        return None

    def log(self, index: int, workflow: str) -> str:
        path = self.results / f"{index:02d}-{workflow}.log"
        return path.read_text() if path.exists() else ""


def run_script(text: str, output_dir: str | os.PathLike, *, job_id: str = "4242", timeout: float = 540,
               env: dict | None = None) -> BatchRun:
    """Run the batch script ``text`` (rendered with ``output_dir``) here with the stand-in
    ``srun``; ``timeout`` seconds at most, then the whole process group is killed."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    work = output_dir / f".one-node-{job_id}"
    install_srun(work / "bin")
    script = work / "job.sbatch"
    script.write_text(text)
    base = dict(os.environ if env is None else env)
    environment = {**base, "PATH": f"{work / 'bin'}:{base.get('PATH', '')}", "SLURM_JOB_ID": job_id,
                   "SLURM_JOB_NUM_NODES": "1", "SLURM_SUBMIT_DIR": str(output_dir)}
    out_path = output_dir / f"spillway-{job_id}.out"
    timed_out = False
    with open(out_path, "w") as out:
        # a session of its own: on a timeout the scheduler and workers go with the script
        proc = subprocess.Popen(["bash", str(script)], env=environment, cwd=output_dir, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop_group(proc)
    _stop_group(proc)  # anything the script's own cleanup left
    return BatchRun(proc.returncode, out_path.read_text(), output_dir / f"spillway-{job_id}", timed_out)


def _stop_group(proc: subprocess.Popen, grace_s: float = 20) -> None:
    """SIGTERM the script's process group, SIGKILL what is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                try:
                    os.killpg(proc.pid, 0)
                except (ProcessLookupError, PermissionError):
                    return
            time.sleep(0.2)
