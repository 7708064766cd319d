"""Ctrl-C on `spillway run`, `up` and `serve` on CPU workers: the terminal's SIGINT to the
whole process group, as a user's Ctrl-C sends it. Each command stops what it started and
says so in one line, exit 130, with no worker's traceback and no process left behind;
a run's partial output is not left where its result would be (issue 75: 41 to 72 lines of
worker tracebacks, "Aborted!", exit 1). The waits are liveness deadlines; how long each
stop took is printed, not asserted (the benchmarks time things)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
#: seconds a command has to reach the state the test interrupts it in, and to end after
LIVENESS_S = 120
#: `spillway run`'s bar on a redirected stderr (--progress): "| 12/1536 tasks"
TASKS = re.compile(r"\| (\d+)/(\d+) tasks")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path, Path]:
    """`spillway ARGS` in a process group of its own (the terminal's), output in files."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen([sys.executable, "-m", "spillway", *args], stdout=o, stderr=e, env=env,
                                cwd=tmp_path, start_new_session=True)
    return proc, out, err


def wait_until(proc: subprocess.Popen, ready, what: str, err: Path):
    deadline = time.monotonic() + LIVENESS_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what}: the command ended first ({proc.returncode}): {err.read_text()[-3000:]}")
        value = ready()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"{what}: not within {LIVENESS_S} s: {err.read_text()[-3000:]}")


def ctrl_c(proc: subprocess.Popen, err: Path) -> tuple[list[psutil.Process], float, list[str]]:
    """SIGINT to the command's process group; its processes before it, seconds to its end,
    and the lines of its stderr."""
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children, "the command started no process of its own"
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(LIVENESS_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"still running {LIVENESS_S} s after Ctrl-C: {err.read_text()[-3000:]}")
    took = time.monotonic() - sent
    # read as written: universal newlines would split the bar's carriage returns into lines
    return children, took, err.read_bytes().decode().split("\n")[:-1]


def assert_all_gone(children: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"left behind: {[(p.pid, p.name()) for p in alive]}"


def assert_one_clean_line(lines: list[str], rc: int, stopped: str) -> None:
    text = "\n".join(lines)
    assert rc == 130, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text and "Aborted" not in text, text
    assert len(lines) <= 3, text
    assert lines[-1].startswith(f"spillway: interrupted: stopped {stopped}"), text


def test_ctrl_c_stops_a_run_mid_run_in_one_line_and_leaves_no_output(tmp_path):
    output = tmp_path / "rows.zarr"
    proc, _, err = start(tmp_path, "run", "slice", "--cpu", "--n-workers", "2", "--dashboard-address", "",
                         "--param", "size=12000x8000", "--param", "chunks=250x250", "--param", "step=4",
                         "--output", str(output), "--progress")

    def mid_run():
        counts = [tuple(map(int, m)) for m in TASKS.findall(err.read_text())]
        return bool(counts) and 0 < counts[-1][0] < counts[-1][1] and output.exists()

    wait_until(proc, mid_run, "the run's first tasks done and its output begun", err)
    children, took, lines = ctrl_c(proc, err)
    # the bar drawn so far, then the one line
    assert_one_clean_line(lines, proc.returncode, "slice, its 2 CPU workers and scheduler")
    assert lines[-1].endswith(f"; nothing left at {output}"), lines[-1]
    assert_all_gone(children)
    assert not output.exists(), sorted(p.name for p in output.rglob("*"))[:10]
    print(f"run stopped in {took:.2f} s after Ctrl-C")


def test_ctrl_c_stops_up_in_one_line_and_removes_its_file(tmp_path):
    sched = tmp_path / "sched.json"
    proc, out, err = start(tmp_path, "up", "--cpu", "--n-workers", "2", "--dashboard-address", "",
                           "--scheduler-file-out", str(sched))
    wait_until(proc, lambda: sched.exists() and "press Ctrl-C to stop" in err.read_text(), "the cluster up", err)
    address = re.search(r"scheduler\s+(tcp://\S+)", out.read_text()).group(1)
    children, took, lines = ctrl_c(proc, err)
    assert_one_clean_line(lines, proc.returncode, f"the cluster at {address} (2 CPU workers) and removed {sched}")
    assert lines == ["press Ctrl-C to stop", lines[-1]], lines
    assert_all_gone(children)
    assert not sched.exists()
    print(f"up stopped in {took:.2f} s after Ctrl-C")


def test_ctrl_c_stops_serve_in_one_line(tmp_path):
    state = tmp_path / "state"
    proc, _, err = start(tmp_path, "serve", "--cpu", "--n-workers", "2", "--port", "0", "--state-dir", str(state))

    def answering():
        found = re.search(r"serving (http://127\.0\.0\.1:\d+)", err.read_text())
        if not found:
            return None
        try:
            return found.group(1) if httpx.get(found.group(1) + "/healthz", timeout=5).status_code == 200 else None
        except httpx.HTTPError:
            return None

    url = wait_until(proc, answering, "the service answering", err)
    children, took, lines = ctrl_c(proc, err)
    assert_one_clean_line(lines, proc.returncode, f"the service at {url} and its cluster (2 CPU workers)")
    # the data directories' line, the serving line, then the interruption's one line
    assert len(lines) == 3 and lines[0].startswith("tenants without data directories of their own"), lines
    assert lines[1].startswith(f"serving {url}") and f"state directory {state}" in lines[1], lines
    assert_all_gone(children)
    print(f"serve stopped in {took:.2f} s after Ctrl-C")
