"""A new user's mistakes, walked through every way in: the command line (run, up, serve,
tenant, a script) and the Python API (spillway.local, a local cluster's methods,
spillway.connect). Each is said in one line that names the value, with exit status 2 on
the command line (a typed exception in Python whose message is that line), and where the
value alone shows the mistake, before any cluster starts.

Read-only and full disks are real: a tmpfs mounted for the test (as root; the cases skip
where mounting is not allowed).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

import spillway
from spillway import OptionsError, ParamError
from spillway.cli import main
from spillway.options.errors import OutputError, ServiceError, SpillwayError

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def mounted(path: Path, *options: str, size: str = "1m"):
    """A tmpfs of ``size`` at ``path`` with mount ``options`` (``ro``), unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join((f"size={size}", *options)), "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'not root'})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@dataclass(frozen=True)
class Mistake:
    id: str
    #: the command line after ``spillway``; ``{tmp}`` is the test's directory
    args: tuple[str, ...]
    #: what the one line must name (the value and what is wrong with it)
    names: str
    #: a tmpfs mounted at {tmp}/disk first: mount options
    disk: tuple[str, ...] | None = None
    #: the value alone shows it: refused before a cluster starts
    before_start: bool = True


#: a CPU batch job's flags, as the README's Slurm section gives them
SLURM = ("slurm", "render", "transpose-sum", "--cpu", "--nodes", "1", "--gpus-per-node", "0", "--time", "00:05:00")

CLI = [
    Mistake("output-in-proc", ("run", "slice", "--cpu", "--output", "/proc/x.zarr"), "cannot write in '/proc'"),
    Mistake("output-dir-missing", ("run", "slice", "--cpu", "--output", "{tmp}/no/such/x.zarr"),
            "directory '{tmp}/no/such' does not exist"),
    Mistake("output-read-only", ("run", "slice", "--cpu", "--output", "{tmp}/disk/x.zarr"),
            "cannot write in '{tmp}/disk' ([Errno 30] Read-only file system)", disk=("ro",)),
    Mistake("output-disk-full", ("run", "slice", "--cpu", "--param", "step=1", "--output", "{tmp}/disk/x.zarr"),
            "output: {tmp}/disk/x.zarr needs 122.07 MiB but its disk has 1.00 MiB free", disk=()),
    Mistake("output-of-a-summary", ("run", "transpose-sum", "--cpu", "--output", "{tmp}/x.zarr"),
            "output: transpose-sum has no array result"),
    Mistake("chunks-past-the-array", ("run", "transpose-sum", "--cpu", "--param", "chunks=8000x8000"),
            "chunks: chunk 8000x8000 is larger than the array 4000x4000"),
    Mistake("3-d-size-of-a-2-d-workflow", ("run", "transpose-sum", "--cpu", "--param", "size=100x100x100"),
            "size: 100x100x100 has 3 dimensions, expected 2"),
    Mistake("1x1-chunks", ("run", "transpose-sum", "--cpu", "--param", "chunks=1x1"),
            "chunks: 1x1 makes 16000000 chunks"),
    Mistake("missing-input-store", ("run", "transpose-sum", "--cpu", "--param", "input=/no/such.zarr"),
            "input: '/no/such.zarr' does not exist"),
    Mistake("unknown-workflow", ("run", "transpose-sm", "--cpu"), "did you mean transpose-sum?"),
    Mistake("unknown-parameter", ("run", "transpose-sum", "--cpu", "--param", "sise=10"), "sise: not a parameter"),
    Mistake("unknown-flag", ("run", "transpose-sum", "--bogus"), "No such option '--bogus'"),
    Mistake("missing-workflow", ("run",), "Missing argument 'WORKFLOW'"),
    Mistake("bad-option-value", ("run", "transpose-sum", "--cpu", "--n-workers", "0"), "n-workers: 0 must be >= 1"),
    Mistake("missing-scheduler-file", ("run", "transpose-sum", "--scheduler-file", "{tmp}/none.json"),
            "scheduler-file: '{tmp}/none.json' does not exist", before_start=False),  # (attaching starts none)
    Mistake("scheduler-file-out-in-proc", ("up", "--cpu", "--scheduler-file-out", "/proc/s.json"),
            "scheduler-file-out: cannot write in '/proc'"),
    Mistake("serve-state-dir-in-proc", ("serve", "--cpu", "--state-dir", "/proc/state"),
            "state-dir: cannot write in '/proc/state'"),
    Mistake("serve-results-dir-in-proc", ("serve", "--cpu", "--state-dir", "{tmp}/state", "--results-dir", "/proc/r"),
            "results-dir: cannot write in '/proc/r'"),
    Mistake("tenant-state-dir-in-proc", ("tenant", "add", "bob", "--state-dir", "/proc/state"),
            "state-dir: cannot write in '/proc/state'"),
    Mistake("slurm-chunks-past-the-array", (*SLURM, "--param", "chunks=8000x8000"),
            "chunks: chunk 8000x8000 is larger than the array 4000x4000"),
    Mistake("slurm-time-too-short", ("slurm", "render", "transpose-sum", "--cpu", "--nodes", "1",
                                     "--gpus-per-node", "0", "--time", "00:01:00"), "time: 00:01:00 is shorter"),
    Mistake("slurm-gpus-on-cpu", ("slurm", "render", "transpose-sum", "--cpu", "--nodes", "1",
                                  "--gpus-per-node", "2", "--time", "00:05:00"), "gpus-per-node: 2 GPUs requested"),
    Mistake("slurm-bad-job-id", ("slurm", "status", "12;rm"), "job id: '12;rm' is not a Slurm job id"),
]


@pytest.mark.parametrize("mistake", CLI, ids=[m.id for m in CLI])
def test_each_mistake_on_the_command_line_is_one_line_and_exit_2(mistake, tmp_path, monkeypatch, request):
    if mistake.before_start:
        request.getfixturevalue("no_cluster")
    args = [a.replace("{tmp}", str(tmp_path)) for a in mistake.args]
    names = mistake.names.replace("{tmp}", str(tmp_path))
    with contextlib.ExitStack() as stack:
        if mistake.disk is not None:
            stack.enter_context(mounted(tmp_path / "disk", *mistake.disk))
        result = CliRunner().invoke(main, args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("spillway: error: "), result.output
    assert names in lines[0], lines[0]


def test_slurm_submit_where_there_is_no_sbatch_makes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no sbatch on it
    result = CliRunner().invoke(main, ["slurm", "submit", *SLURM[2:], "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        "spillway: error: sbatch: not found on the PATH; run this on a Slurm login node"]
    assert not (tmp_path / "out").exists()


def test_a_stale_scheduler_file_is_named_at_once(tmp_path):
    """A file left by a cluster that ended (up killed): where nothing listens on its address,
    one line at once rather than the client's 30 s of retries."""
    import json
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once it is closed
    stale = tmp_path / "sched.json"
    stale.write_text(json.dumps({"type": "Scheduler", "address": f"tcp://127.0.0.1:{port}"}))
    result = CliRunner().invoke(main, ["run", "transpose-sum", "--scheduler-file", str(stale)])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        f"spillway: error: scheduler-file: {str(stale)!r} names tcp://127.0.0.1:{port}, where nothing listens: the "
        "file of a cluster that has ended? (start one with `spillway up`, or remove the file)"]


def test_slurm_render_says_the_output_dir_is_not_there(tmp_path):
    result = CliRunner().invoke(main, [*SLURM, "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 0 and result.stdout.startswith("#!/")
    assert result.stderr.splitlines() == [
        f"spillway: note: output-dir '{tmp_path / 'out'}' does not exist here; make it before the job starts "
        f"(mkdir -p {tmp_path / 'out'}); sbatch does not"]


def test_a_disk_that_fills_while_the_run_writes_is_one_line_and_exit_2(tmp_path):
    """The space is there when the run is checked, and gone while its workers write: the
    workers' own log of the failed task stays out of the way of the one line."""
    script = tmp_path / "fill.py"
    script.write_text(textwrap.dedent(f"""
        from spillway.workflows import outputs
        # the disk "had room" when the run was checked
        outputs.check_space = lambda path, nbytes: None
        from spillway.cli import main
        if __name__ == "__main__":
            main(["run", "slice", "--cpu", "--n-workers", "2", "--dashboard-address", "",
                  "--param", "size=2000x2000", "--param", "step=1", "--output", {str(tmp_path / 'disk' / 'x.zarr')!r}])
    """))
    with mounted(tmp_path / "disk", size="2m"):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                              cwd=tmp_path, env=_env())
        left = list((tmp_path / "disk").iterdir())
    # a loaded machine may outlast the close's wait for a worker to exit: the nanny then
    # kills it and says so (two lines of distributed's about the close, not the run)
    closing = ("WARNING distributed.nanny: Worker process still alive after", "INFO distributed.nanny: Worker process ")
    lines = [line for line in (done.stdout + done.stderr).splitlines()
             if line.strip() and not (line.startswith(closing) and ("killing" in line or "killed by signal 9" in line))]
    assert done.returncode == 2, done.stderr
    assert lines == [f"spillway: error: output: writing {tmp_path / 'disk' / 'x.zarr'} failed: "
                     "[Errno 28] No space left on device; the partial store was removed"], lines
    assert left == []


def test_a_script_without_the_main_guard_is_one_line_and_exit_2(tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(textwrap.dedent("""
        import spillway
        with spillway.local(cpu=True, n_workers=2, dashboard_address=None) as cluster:
            print(cluster.run("transpose-sum", progress=False)["result"])
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=_env())
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert lines == ['spillway: error: snippet.py, line 3: the cluster is started at the script\'s top level; '
                     'start the cluster under `if __name__ == "__main__":` (worker processes import the script '
                     'again; see the README, From a script)'], lines


def _env() -> dict:
    import os

    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


# --- the Python API: a typed exception whose message is the one line


def _one_line(error: BaseException, names: str) -> None:
    message = str(error)
    assert isinstance(error, SpillwayError), type(error)
    assert "\n" not in message and names in message, message


@pytest.mark.parametrize("keywords, names", [
    ({"nworkers": 2}, "nworkers: not a spillway option (did you mean n_workers?)"),
    ({"cpu": True, "n_workers": -1}, "n-workers: -1 must be >= 1"),
    ({"rmm_pool_size": "lots"}, "rmm-pool-size"),
])
def test_local_refuses_bad_options_before_a_cluster_starts(keywords, names, no_cluster):
    with pytest.raises(OptionsError) as refused:
        spillway.local(**keywords)
    _one_line(refused.value, names)


def test_local_attached_to_a_scheduler_file_that_is_not_there_is_one_line():
    with pytest.raises(OptionsError) as refused:
        spillway.local(scheduler_file="/no/such.json")
    _one_line(refused.value, "scheduler-file: '/no/such.json' does not exist")


def test_connect_to_nothing_is_one_line():
    with pytest.raises(ServiceError) as refused:
        spillway.connect("http://127.0.0.1:1", "spw_token")
    _one_line(refused.value, "cannot reach the service at http://127.0.0.1:1")


@pytest.fixture(scope="module")
def cluster():
    with spillway.local(cpu=True, n_workers=2, dashboard_address=None) as lc:
        yield lc


@pytest.mark.parametrize("call, error, names", [
    (lambda c: c.open("/no/such.zarr"), ParamError, "open: no Zarr store at '/no/such.zarr'"),
    (lambda c: c.run("transpose-sum", chunks="8000x8000"), ParamError, "chunks: chunk 8000x8000 is larger"),
    (lambda c: c.run("transpose-sum", size="100x100x100"), ParamError, "size: 100x100x100 has 3 dimensions"),
    (lambda c: c.run("transpose-sum", chunks="1x1"), ParamError, "chunks: 1x1 makes 16000000 chunks"),
    (lambda c: c.run("slice", output="/proc/x.zarr"), ParamError, "cannot write in '/proc'"),
    (lambda c: c.run("transpose-sm"), ParamError, "did you mean transpose-sum?"),
    (lambda c: c.run("transpose-sum", input="/no/such.zarr"), ParamError, "input: '/no/such.zarr' does not exist"),
], ids=["open-missing-store", "chunks-past-the-array", "3-d-size", "1x1-chunks", "output-in-proc",
        "unknown-workflow", "missing-input-store"])
def test_a_local_clusters_methods_refuse_with_one_line(cluster, call, error, names):
    with pytest.raises(error) as refused:
        call(cluster)
    _one_line(refused.value, names)


def test_a_local_run_into_a_full_disk_is_one_line(cluster, tmp_path):
    with mounted(tmp_path / "disk"):
        with pytest.raises(ParamError) as refused:
            cluster.run("slice", step=1, output=str(tmp_path / "disk" / "x.zarr"), progress=False)
    _one_line(refused.value, "needs 122.07 MiB but its disk has 1.00 MiB free")


def test_output_errors_of_the_os_exit_2():
    assert OutputError("x", exit_code=2).exit_code == 2 and OutputError("x").exit_code == 1


def test_serve_on_a_port_in_use_is_one_line_before_any_cluster(tmp_path, no_cluster):
    """The API's port is taken before the cluster starts: one in use is refused at once,
    with nothing started (and no cluster listener can take it while workers start)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["serve", "--cpu", "--state-dir", str(tmp_path / "state"),
                                           "--port", str(port)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert lines == [f"spillway: error: port: cannot listen on 127.0.0.1:{port} ([Errno 98] Address already in use)"]
