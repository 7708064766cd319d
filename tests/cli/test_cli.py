"""The CLI through click's CliRunner and as real processes, on CPU workers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

from reference_inputs import uniform_numpy
from spillway.cli import main

QUIET = ["--dashboard-address", "", "--cpu", "--n-workers", "2"]


def invoke(*args, **kw):
    return CliRunner().invoke(main, list(args), catch_exceptions=False, **kw)


@pytest.mark.parametrize("command", [[], ["run"], ["up"], ["info"], ["config"], ["workflows"], ["worker"],
                                     ["mpi"], ["wait-workers"], ["slurm"]])
def test_help_has_examples(command):
    result = invoke(*command, "--help")
    assert result.exit_code == 0
    assert "Example" in result.output


@pytest.mark.parametrize("command", ["run", "up"])
def test_short_help_shows_the_common_cluster_flags_and_points_to_the_rest(command):
    from spillway.options.settings import OPTIONS

    text = invoke(command, "--help", terminal_width=80).output
    assert len(text.splitlines()) <= 60, f"{len(text.splitlines())} lines:\n{text}"
    shown = {o.flag for o in OPTIONS if re.search(rf"^  {re.escape(o.flag)}\b", text, re.M)}
    assert shown == {o.flag for o in OPTIONS if o.common}, shown
    assert {"--devices", "--n-workers", "--memory-limit", "--device-memory-limit"} <= shown
    assert "--threads-per-worker" not in text and "--transfer-offload" not in text
    if command == "run":
        assert "`spillway config --help`" in " ".join(text.split())
    # every flag, hidden or not, is in spillway config's help
    full = invoke("config", "--help").output
    assert all(o.flag in full for o in OPTIONS)


def test_hidden_cluster_flags_are_still_taken(monkeypatch):
    import spillway.cli.run as run_module

    seen = {}

    def resolve(flags):
        seen.update(flags)
        raise SystemExit(0)  # enough: the flags were parsed; no cluster

    monkeypatch.setattr(run_module, "resolve", resolve)
    result = invoke("run", "transpose-sum", "--threads-per-worker", "2", "--no-prefetch", "--transfer-offload", "1GB")
    assert result.exit_code == 0, result.output
    assert (seen["threads_per_worker"], seen["prefetch"], seen["transfer_offload"]) == ("2", False, "1GB")
    # and checked as any flag is: a bad value of a hidden one is one line, exit 2
    monkeypatch.undo()
    bad = CliRunner().invoke(main, ["run", "transpose-sum", "--threads-per-worker", "0"])
    assert bad.exit_code == 2 and "threads-per-worker" in bad.output and len(bad.output.splitlines()) == 1, bad.output


def test_help_imports_no_gpu_or_cluster_library():
    code = ("import sys; from click.testing import CliRunner; from spillway.cli import main; "
            "r = CliRunner().invoke(main, ['--help']); assert r.exit_code == 0; "
            "print(sorted(m for m in ('cupy', 'rmm', 'dask_cuda', 'distributed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_python_dash_m_service():
    out = subprocess.run([sys.executable, "-m", "spillway", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Usage: spillway" in out.stdout


def test_config_reports_sources(monkeypatch):
    monkeypatch.setenv("DASK_SPILLWAY__RMM_POOL_SIZE", "2GB")
    result = invoke("config", "--json", "--protocol", "tcp")
    rows = json.loads(result.output)
    assert {k: rows["rmm-pool-size"][k] for k in ("value", "source")} == {
        "value": 2_000_000_000, "source": "env DASK_SPILLWAY__RMM_POOL_SIZE"}
    assert rows["protocol"] == {"value": "tcp", "source": "flag --protocol"}
    assert rows["host"]["source"] == "default"


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["config", "--rmm-pool-size", "12XB"], "rmm-pool-size: cannot parse '12XB'"),
        (["config", "--rmm-managed-memory"], "managed memory cannot be used with NVLink"),
        (["config", "--rmm-async", "--rmm-managed-memory", "--no-nvlink"], "async allocator"),
        (["config", "--rmm-release-threshold", "1GB"], "needs rmm-async"),
        (["run", "transpose-sum", "--n-workers", "0"], "n-workers: 0 must be >= 1"),
        (["run", "no-such-workflow", "--cpu"], "workflow 'no-such-workflow' is unknown"),
        (["run", "transpose-sum", "--cpu", "--param", "size=-5"], "size: -5 must have dimensions >= 1"),
        (["run", "transpose-sum", "--cpu", "--param", "sise=10"], "sise: not a parameter of transpose-sum"),
        (["run", "transpose-sum", "--cpu", "--param", "size=100x100", "--param", "chunks=200x200"],
         "larger than the array"),
        (["run", "transpose-sum", "--cpu", "--param", "dtype=int8"], "dtype: 'int8' is not a supported dtype"),
        (["run", "transpose-sum", "--cpu", "--param", "size=99999999999999999999x9"], "more than"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, fragment, no_cluster):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    lines = [l for l in result.output.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("spillway: error: ") and fragment in lines[0], result.output


def test_run_transpose_sum_matches_numpy():
    result = invoke("run", "transpose-sum", "--json", "--verify", "--param", "size=600x600",
                    "--param", "chunks=200x200", "--param", "seed=7", *QUIET)
    report = json.loads(result.output.strip().splitlines()[-1])
    x = uniform_numpy((600, 600), seed=7)
    expected = (x + x.T).sum()
    assert abs(report["result"]["sum"] - expected) / abs(expected) < 1e-12
    assert report["verify"]["ok"] is True and report["verify"]["rel_error"] < 1e-12
    assert report["cluster"] == {"kind": "cpu", "n_workers": 2, "protocol": "tcp"}
    for key in ("workflow", "params", "wall_s", "bytes_transferred", "bytes_spilled", "peak_bytes_per_worker"):
        assert key in report
    assert report["tasks"] >= 9
    assert len(report["peak_bytes_per_worker"]) == 2
    assert all(v > 10_000_000 for v in report["peak_bytes_per_worker"].values())  # real RSS of a worker


def test_run_text_report():
    result = invoke("run", "transpose-sum", "--param", "size=300x300", "--param", "chunks=100x100",
                    "--verify", "--progress", *QUIET)
    assert "verify        OK" in result.output
    assert "transferred" in result.output and "peak memory" in result.output


def test_workflows_json_catalogue():
    entries = json.loads(invoke("workflows", "--json").output)
    names = [e["name"] for e in entries]
    assert "transpose-sum" in names
    for entry in entries:
        assert set(entry) >= {"name", "description", "schema"}
        assert entry["schema"]["type"] == "object"


def test_up_then_run_attached_then_sigterm(tmp_path):
    sched = tmp_path / "sched.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "spillway", "up", "--cpu", "--n-workers", "2", "--dashboard-address", "",
         "--scheduler-file-out", str(sched)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )
    try:
        deadline = time.time() + 90
        while not sched.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert sched.exists(), proc.stderr.read() if proc.poll() is not None else "no scheduler file"
        time.sleep(0.5)
        out = subprocess.run(
            [sys.executable, "-m", "spillway", "run", "transpose-sum", "--scheduler-file", str(sched),
             "--param", "size=400x400", "--param", "chunks=100x100", "--json", "--verify"],
            capture_output=True, text=True, timeout=120, env=env,
        )
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["verify"]["ok"] and report["cluster"]["n_workers"] == 2
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
        assert "scheduler       tcp://127.0.0.1:" in stdout
        # the file named a scheduler that is gone: up removed it as it ended
        assert not sched.exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


NOISE = '''\
import os, subprocess, sys

def dask_setup(server):
    # what UCX does: C code writing to fd 1, here and in a process it starts
    os.write(1, b"UCX  WARN  unused environment variable: UCX_MEMTYPE_CACHE\\n")
    subprocess.run([sys.executable, "-c", "import os; os.write(1, b'child of ' + b'%s\\\\n')" % type(server).__name__])
    print("and Python's print", flush=True)
'''


@pytest.mark.timeout(180)
def test_run_json_stdout_is_one_object_whatever_processes_print(tmp_path):
    """Workers (other processes), their children and the scheduler (this process) write to
    fd 1 at the C level while the cluster runs; stdout still holds the report alone."""
    preload = tmp_path / "noise.py"
    preload.write_text(NOISE)
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               DASK_DISTRIBUTED__WORKER__PRELOAD=f"['{preload}']",
               DASK_DISTRIBUTED__SCHEDULER__PRELOAD=f"['{preload}']")
    out = subprocess.run(
        [sys.executable, "-m", "spillway", "run", "transpose-sum", "--param", "size=200x200", "--json", *QUIET],
        capture_output=True, text=True, timeout=150, env=env,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["workflow"] == "transpose-sum" and out.stdout.count("\n") == 1
    # the noise went to stderr, from the scheduler's process and both workers
    assert out.stderr.count("unused environment variable") == 3, out.stderr
    # (the scheduler's class is distributed's, or spillway's subclass without an HTTP server)
    assert re.search(r"child of \w*Worker", out.stderr) and re.search(r"child of \w*Scheduler", out.stderr), out.stderr


def test_json_stdout_in_process_keeps_fd1_and_writes_to_the_stream(capsys):
    from spillway.cli.stdout import JsonStdout

    with JsonStdout() as out:
        out.emit('{"a": 1}')
    assert capsys.readouterr().out == '{"a": 1}\n'


def test_json_stdout_moves_fd1_and_restores_it(tmp_path):
    code = ("import os, sys\n"
            "from spillway.cli.stdout import JsonStdout\n"
            "with JsonStdout() as out:\n"
            "    os.write(1, b'c-level\\n'); print('python'); out.emit('{}')\n"
            "os.write(1, b'after\\n')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "{}\nafter\n" and done.stderr == "c-level\npython\n"


def test_config_marks_the_gpu_workers_options_where_the_workers_are_cpus():
    text = invoke("config", "--cpu").output.splitlines()
    assert text[0] == "# CPU workers here (cpu is true): the options marked 'GPU only' are not used"
    rows = {line.split()[0]: line for line in text[1:]}
    assert rows["rmm-pool-size"].endswith("(GPU only, not used)")
    assert not rows["memory-limit"].endswith("(GPU only, not used)")
    as_json = json.loads(invoke("config", "--cpu", "--json").output)
    assert as_json["rmm-pool-size"]["used"] is False and "used" not in as_json["threads-per-worker"]
