"""The matrix's ``service`` and ``batch`` paths, each with its own cluster from the
defaults: ``spillway serve`` on loopback with a tenant added with no options, the job
submitted with ``verify=True``; and the rendered one-node batch script run with the
``srun`` stand-in. Both rows come from the run's report (:func:`.rows.report_row`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from .cases import Case, workflow_params
from .rows import report_row, row
from .scale import SEED, Scale

#: words of admission's refusal (``spillway.memory.admission.admit``)
REFUSED = "exceeds the cluster's device + host + disk capacity"
#: seconds for ``spillway serve`` to answer (its cluster's workers start first)
SERVE_START_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _first_error(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() or REFUSED in line]
    return (errors or lines or [""])[-1].strip()


def run_service(case: Case, scale: Scale, *, cluster_args: tuple[str, ...] = (), timeout: float = 540,
                python: str = sys.executable, seed: int = SEED) -> dict:
    """``case`` through ``spillway serve`` on loopback, submitted by a tenant added with no
    options; the row from the finished job's report."""
    import httpx

    import spillway
    from spillway.service.client import JobFailed, ServiceError

    params, projected = workflow_params(case, scale, seed)
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    state = tempfile.mkdtemp(prefix="spillway-matrix-service-")
    server = None
    log_path = os.path.join(state, "serve.log")
    try:
        added = subprocess.run([python, "-m", "spillway", "tenant", "add", "matrix", "--state-dir", state],
                               capture_output=True, text=True, timeout=60)
        if added.returncode != 0:
            return row(case, scale, params=params, error=f"tenant add: {_first_error(added.stderr)}")
        token = added.stdout.strip().splitlines()[-1]
        url = f"http://127.0.0.1:{_free_port()}"
        with open(log_path, "wb") as log:
            server = subprocess.Popen([python, "-m", "spillway", "serve", "--port", url.rsplit(":", 1)[1],
                                       "--state-dir", state, *cluster_args], stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        if not _wait_healthy(url, server, min(deadline, time.monotonic() + SERVE_START_S)):
            return row(case, scale, params=params,
                       error=f"spillway serve did not answer: {_first_error(_read(log_path))}")
        with spillway.connect(url, token) as service:
            submitted = time.perf_counter()
            try:
                job = service.submit(case.workflow, params, verify=True)
            except ServiceError as e:
                return row(case, scale, params=params, footprint_bytes=projected, refused=REFUSED in str(e),
                           error=str(e), process_s=time.perf_counter() - t0)
            submit_s = time.perf_counter() - submitted
            try:
                result = job.result(timeout=max(1.0, deadline - time.monotonic()))
            except (JobFailed, TimeoutError) as e:
                return row(case, scale, params=params, footprint_bytes=job.record["footprint_bytes"],
                           error=str(e), process_s=time.perf_counter() - t0)
            except httpx.HTTPError as e:
                return row(case, scale, params=params, error=f"service: {type(e).__name__}: {e}")
        return report_row(case, scale, params, dict(result.report), submit_s=submit_s,
                          process_s=time.perf_counter() - t0)
    finally:
        if server is not None:
            _stop(server)
        shutil.rmtree(state, ignore_errors=True)


def _wait_healthy(url: str, server: subprocess.Popen, deadline: float) -> bool:
    import httpx

    while time.monotonic() < deadline:
        if server.poll() is not None:
            return False
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return False


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the service (it stops its cluster), then its whole session if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(2)
    if proc.poll() is None:
        proc.wait(10)


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-4000:]
    except OSError:
        return ""


def run_batch(case: Case, scale: Scale, *, cluster_args: tuple[str, ...] = (), timeout: float = 540,
              python: str = sys.executable, seed: int = SEED) -> dict:
    """``case`` as the rendered one-node batch script, run here with the srun stand-in;
    the row from the job's report."""
    from spillway.launch.slurm_batch import run_script

    params, projected = workflow_params(case, scale, seed)
    t0 = time.perf_counter()
    out = tempfile.mkdtemp(prefix="spillway-matrix-batch-")
    gpus = 0 if "--cpu" in cluster_args else scale.n_workers
    try:
        rendered = subprocess.run(
            [python, "-m", "spillway", "slurm", "render", case.workflow,
             *[a for k, v in params.items() for a in ("--param", f"{k}={v}")],
             "--nodes", "1", "--gpus-per-node", str(gpus), "--time", "00:09:30", "--output-dir", out,
             "--python", python, "--start-timeout", "240", *cluster_args],
            capture_output=True, text=True, timeout=120)
        if rendered.returncode != 0:
            return row(case, scale, params=params, footprint_bytes=projected,
                       error=f"slurm render: {_first_error(rendered.stderr)}")
        run = run_script(rendered.stdout, out, job_id=str(4000 + os.getpid() % 1000),
                         timeout=max(30.0, timeout - (time.perf_counter() - t0)))
        elapsed = time.perf_counter() - t0
        report = run.report(1, case.workflow)
        if report is None:
            why = _first_error(run.log(1, case.workflow)) or _first_error(run.output)
            if run.timed_out:
                why = f"timed out after {timeout:.0f} s; {why}"
            return row(case, scale, params=params, footprint_bytes=projected, refused=REFUSED in why,
                       error=why or f"the script exited {run.returncode}", process_s=elapsed)
        return report_row(case, scale, params, report, exited_ok=run.returncode == 0, process_s=elapsed,
                          error=None if run.returncode == 0 else
                          (_first_error(run.log(1, case.workflow)) or f"the script exited {run.returncode}"))
    finally:
        shutil.rmtree(out, ignore_errors=True)
