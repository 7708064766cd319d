"""The sbatch script as text: directives, layout, worker flags from the options, cleanup."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from spillway.launch import commands
from spillway.launch.slurm_batch import JobSettings, Run, job_script, parse_walltime, worker_lifetime
from spillway.options.errors import OptionsError
from spillway.options.settings import Options

GPU_JOB = JobSettings(nodes=2, gpus_per_node=4, time="01:00:00", partition="gpu", account="proj", qos="high",
                      job_name="spillway-transpose-sum", output_dir="/shared/runs", python="/shared/venv/bin/python",
                      extra_directives=("--constraint=h200", "#SBATCH --exclusive"), setup=("module load cuda/13",))
RUNS = [Run("transpose-sum", {"size": "200GB"})]


def directives(text: str) -> list[str]:
    return [line[len("#SBATCH "):] for line in text.splitlines() if line.startswith("#SBATCH ")]


def line_with(text: str, needle: str) -> str:
    """The logical (backslash-joined) line of the script that contains ``needle``."""
    joined = text.replace("\\\n", " ")
    matches = [line for line in joined.splitlines() if needle in line]
    assert len(matches) == 1, (needle, matches)
    return matches[0]


def test_gpu_script_directives_and_layout():
    text = job_script(Options.resolve(rmm_pool_size="100GB", device_memory_limit="120GB"), GPU_JOB, RUNS)
    assert directives(text) == [
        "--job-name=spillway-transpose-sum", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=4",
        "--cpus-per-task=8", "--time=01:00:00", "--partition=gpu", "--account=proj", "--qos=high",
        "--output=/shared/runs/spillway-%j.out", "--constraint=h200", "--exclusive",
    ]
    scheduler = shlex.split(line_with(text, "dask scheduler"))
    assert scheduler[:5] == ["srun", "--overlap", "--nodes=1", "--ntasks=1", "--cpu-bind=none"]
    # loopback cannot be reached from the second node: the scheduler takes the node's address
    assert "--host" not in scheduler and scheduler[scheduler.index("--protocol") + 1] == "ucx"
    # the default store is spillway's tiered one, which `dask cuda worker` cannot be given
    assert "dask cuda worker" not in text
    worker = shlex.split(line_with(text, "-m spillway worker"))
    assert worker[:6] == ["srun", "--overlap", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=8",
                          "--cpu-bind=none"]
    flags = dict(zip(worker, worker[1:]))
    assert flags["--rmm-pool-size"] == "100000000000"
    assert flags["--device-memory-limit"] == "120000000000"
    assert flags["--memory-store"] == "tiered" and flags["--pinned-pool-size"] == "auto"
    assert flags["--scheduler-file"] == "$SCHEDULER_FILE" and flags["--protocol"] == "ucx"
    assert "--nvlink" in worker
    assert "--workers 8" in line_with(text, "wait-workers")
    assert "module load cuda/13" in text.splitlines()
    assert "export DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT=True" in text
    assert "export UCX_WARN_UNUSED_ENV_VARS=n" in text
    # results and report next to the job output
    assert "RESULTS=/shared/runs/spillway-${SLURM_JOB_ID}" in text
    run = line_with(text, "-m spillway run")
    assert '>"$RESULTS/01-transpose-sum.json"' in run
    assert "--verify --json --no-progress --scheduler-file \"$SCHEDULER_FILE\"" in run


def test_dask_cuda_store_keeps_dask_cuda_worker():
    options = Options.resolve(rmm_pool_size="100GB", device_memory_limit="120GB", memory_store="dask-cuda")
    text = job_script(options, GPU_JOB, RUNS)
    assert "-m spillway worker" not in text
    worker = shlex.split(line_with(text, "dask cuda worker"))
    flags = dict(zip(worker, worker[1:]))
    assert flags["--rmm-pool-size"] == "100000000000"
    assert flags["--device-memory-limit"] == "120000000000"
    assert flags["--set-rmm-allocator-for-libs"] == "cupy"
    assert flags["--scheduler-file"] == "$SCHEDULER_FILE"
    assert "--enable-nvlink" in worker
    # managed memory has no device tier to manage: dask-cuda's store as well
    managed = job_script(Options.resolve(rmm_managed_memory=True, nvlink=False), GPU_JOB, RUNS)
    assert "dask cuda worker" in managed and "-m spillway worker" not in managed


def test_spillway_worker_flags_parse_back_to_the_options(tmp_path, monkeypatch):
    """The rendered `spillway worker` arguments, parsed by the real command, give the
    options the script was rendered from (every worker setting, unset ones included)."""
    from click.testing import CliRunner

    from spillway.cli import main
    from spillway import launch

    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("x")
    options = Options.resolve(rmm_pool_size=0.8, rmm_maximum_pool_size="130GB", device_memory_limit="100GB",
                              memory_limit=0.4, pinned_pool_size="48GB", nvlink=False, threads_per_worker=3,
                              transfer_connections=4, local_directory=str(tmp_path), interface="ib0",
                              rmm_track_allocations=True, tls_ca_file=str(tmp_path / "ca.pem"),
                              tls_cert=str(tmp_path / "cert.pem"), tls_key=str(tmp_path / "key.pem"))
    worker = shlex.split(line_with(job_script(options, GPU_JOB, RUNS), "-m spillway worker"))
    args = worker[worker.index("spillway") + 1:]
    args = [str(tmp_path / "s.json") if a == "$SCHEDULER_FILE" else a for a in args[:args.index(">$RESULTS/workers.log")]]
    seen = {}
    monkeypatch.setattr(launch, "run_node", lambda opts, **kw: seen.update(options=opts, **kw))
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    got = seen["options"]
    assert seen["death_timeout"] == 60 and got.scheduler_file == str(tmp_path / "s.json")
    assert got.protocol == "ucx"
    for o in commands.WORKER_OPTIONS:
        assert getattr(got, o.name) == getattr(options, o.name), o.key
        assert got.sources[o.name] == f"flag {o.flag}", o.key


def test_worker_lifetime_is_shorter_than_walltime():
    text = job_script(Options.resolve(), GPU_JOB, RUNS)
    lifetime = int(re.search(r"LIFETIME__DURATION=(\d+)s", text).group(1))
    assert lifetime == 3600 - 360
    assert worker_lifetime(300) == 240 and worker_lifetime(86400) == 86400 - 600


def test_cleanup_trap_and_background_steps():
    text = job_script(Options.resolve(), GPU_JOB, RUNS)
    assert "trap cleanup EXIT" in text and "trap 'exit 143' TERM" in text
    # every long step runs in the background and is waited for, so a cancel is handled at once
    for needle in ("dask scheduler", "-m spillway worker", "wait-workers", "-m spillway run"):
        assert line_with(text, needle).rstrip().endswith("&"), needle


def test_script_is_valid_bash(tmp_path):
    path = tmp_path / "job.sh"
    path.write_text(job_script(Options.resolve(), GPU_JOB, RUNS + [Run("transpose-sum", {"seed": 3})]))
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "02-transpose-sum.json" in path.read_text()


def test_cpus_and_memory_per_node():
    job = JobSettings(nodes=1, gpus_per_node=2, time="00:10:00", cpus_per_task=16, mem="500G")
    text = job_script(Options.resolve(threads_per_worker=4), job, RUNS)
    assert "--cpus-per-task=16" in directives(text) and "--mem=500G" in directives(text)
    assert "--cpus-per-task=16" in line_with(text, "-m spillway worker")
    # by default one CPU per worker thread plus one per worker
    default = job_script(Options.resolve(threads_per_worker=4), JobSettings(gpus_per_node=2, time="10"), RUNS)
    assert "--cpus-per-task=10" in directives(default)
    cpu = job_script(Options.resolve(cpu=True), JobSettings(time="10"), RUNS)
    assert not any(d.startswith("--cpus-per-task") for d in directives(cpu))


def test_cpu_fallback_uses_dask_worker_and_no_gpus():
    job = JobSettings(nodes=2, gpus_per_node=0, time="00:10:00", output_dir="/scratch/x")
    text = job_script(Options.resolve(cpu=True, n_workers=4, memory_limit="2GB"), job, RUNS)
    assert not any(d.startswith("--gpus") for d in directives(text))
    worker = shlex.split(line_with(text, "dask worker"))
    flags = dict(zip(worker, worker[1:]))
    assert flags["--nworkers"] == "2" and flags["--memory-limit"] == "2000000000"
    assert flags["--protocol"] == "tcp"
    assert "cuda" not in line_with(text, "dask worker")
    assert "--workers 4" in line_with(text, "wait-workers")


def test_single_node_keeps_loopback_host():
    job = JobSettings(nodes=1, gpus_per_node=0, time="00:10:00")
    scheduler = shlex.split(line_with(job_script(Options.resolve(cpu=True), job, RUNS), "dask scheduler"))
    assert scheduler[scheduler.index("--host") + 1] == "127.0.0.1"


def test_interface_and_tls_reach_every_process(tmp_path):
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("x")
    options = Options.resolve(interface="ib0", tls_ca_file=str(tmp_path / "ca.pem"),
                              tls_cert=str(tmp_path / "cert.pem"), tls_key=str(tmp_path / "key.pem"))
    text = job_script(options, GPU_JOB, RUNS)
    for needle in ("dask scheduler", "-m spillway worker", "wait-workers", "-m spillway run"):
        assert f"--tls-ca-file {tmp_path / 'ca.pem'}" in line_with(text, needle), needle
    for needle in ("dask scheduler", "-m spillway worker"):
        assert "--interface ib0" in line_with(text, needle)


def test_rendering_is_pure():
    options = Options.resolve()
    assert job_script(options, GPU_JOB, RUNS) == job_script(options, GPU_JOB, RUNS)


@pytest.mark.parametrize("text,seconds", [("30", 1800), ("05:00", 300), ("01:30:00", 5400), ("2-00", 172800),
                                          ("1-02:03", 93780), ("1-02:03:04", 93784)])
def test_walltime_formats(text, seconds):
    assert parse_walltime(text) == seconds


@pytest.mark.parametrize("kwargs,message", [
    (dict(time="1:75:00"), "time: '1:75:00' has minutes or seconds above 59"),
    (dict(time="soon"), "time: 'soon' is not a Slurm time"),
    (dict(time="00:01:00"), "time: 00:01:00 is shorter than the minimum 00:02:00"),
    (dict(nodes=0), "nodes: 0 must be an integer in [1, 100000]"),
    (dict(gpus_per_node=65), "gpus-per-node: 65 must be an integer in [0, 64]"),
    (dict(partition="gpu; rm -rf /"), "partition: 'gpu; rm -rf /' must be one word"),
    (dict(extra_directives=("constraint=h200",)), "extra directive: 'constraint=h200' must be one sbatch option"),
    (dict(mem="lots"), "mem: 'lots' is not a Slurm memory size"),
    (dict(output_dir="/my runs"), "output-dir: '/my runs' must be a directory path without spaces"),
])
def test_bad_job_settings_name_value_and_limit(kwargs, message):
    with pytest.raises(OptionsError) as e:
        JobSettings(**kwargs)
    assert str(e.value).startswith(message)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("options,job,message", [
    (dict(cpu=True), dict(gpus_per_node=4), "gpus-per-node: 4 GPUs requested but cpu is true"),
    (dict(), dict(gpus_per_node=0), "gpus-per-node: 0 GPUs gives no GPU workers"),
    (dict(n_workers=3), dict(nodes=2, gpus_per_node=4), "n-workers: 3 does not match 2 nodes x 4 GPUs"),
    (dict(cpu=True, n_workers=3), dict(nodes=2), "n-workers: 3 does not split evenly over 2 nodes"),
    (dict(devices="0,1"), dict(gpus_per_node=2), "devices: 0,1 cannot be chosen in a batch job"),
    (dict(scheduler_address="tcp://h:1"), dict(gpus_per_node=2), "scheduler-address/scheduler-file"),
])
def test_impossible_layouts_stop_before_rendering(options, job, message):
    settings = JobSettings(**{"time": "00:10:00", **job})
    with pytest.raises(OptionsError) as e:
        job_script(Options.resolve(**options), settings, RUNS)
    assert str(e.value).startswith(message)
