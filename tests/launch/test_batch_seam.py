"""The batch seam: a PBS-like system written as class attributes only renders a job
script from the same options and job settings as Slurm, with its own directives, step
launchers and job-id variable and the same cluster inside, and drives its queue through
its own commands (answered by a stand-in; no PBS here)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from spillway.options.errors import OptionsError
from spillway.options.settings import Options
from spillway.launch.batch import BatchError, BatchSystem, JobIdError, JobSettings, Run
from spillway.launch.slurm_batch import Slurm
from stand_ins import FakeShell


class PBS(BatchSystem):
    name = "PBS"
    directive_prefix = "#PBS"
    directive_formats = ("-N {job_name}", "-l select={nodes}:ncpus={cpus_per_task}:ngpus={gpus_per_node}",
                         "-l walltime={walltime}", "-q {partition}", "-A {account}", "-o {output_dir}/", "-j oe")
    job_id_variable = "PBS_JOBID"
    script_name = "job.pbs"
    step_launcher = "mpiexec"
    scheduler_step = "mpiexec -n 1"
    worker_step = "mpiexec -n {nodes} --map-by ppr:1:node"
    submit_command = ("qsub",)
    status_command = ("qstat", "-x", "-F", "dsv", "{job_id}")
    status_fields = ("job_id", "state", "elapsed")
    active_states = frozenset({"Q", "R", "H", "E"})
    cancel_command = ("qdel", "{job_id}")
    job_id_regexp = r"\d+\.[A-Za-z0-9.-]+"
    job_id_form = "digits.server"


OPTIONS = Options.resolve(rmm_pool_size="100GB", device_memory_limit="120GB")
JOB = JobSettings(nodes=2, gpus_per_node=4, time="01:00:00", partition="gpu", account="proj",
                  job_name="spillway-transpose-sum", output_dir="/shared/runs", python="/shared/venv/bin/python",
                  extra_directives=("-l place=excl",), setup=("module load cuda/13",))
RUNS = [Run("transpose-sum", {"size": "200GB"}), Run("transpose-sum", {"seed": 2}, verify=False)]


def logical_lines(text: str) -> list[str]:
    return text.replace("\\\n", " ").splitlines()


def line_with(text: str, needle: str) -> str:
    matches = [line for line in logical_lines(text) if needle in line]
    assert len(matches) == 1, (needle, matches)
    return matches[0]


def from_python(line: str) -> str:
    """What a step runs, without the launcher in front of it."""
    return line[line.index('"$PYTHON"'):]


def test_a_system_of_class_attributes_renders_its_directives():
    text = PBS().job_script(OPTIONS, JOB, RUNS)
    assert [line for line in text.splitlines() if line.startswith("#PBS")] == [
        "#PBS -N spillway-transpose-sum", "#PBS -l select=2:ncpus=8:ngpus=4", "#PBS -l walltime=01:00:00",
        "#PBS -q gpu", "#PBS -A proj", "#PBS -o /shared/runs/", "#PBS -j oe", "#PBS -l place=excl",
    ]
    assert "#SBATCH" not in text and "srun" not in text and "SLURM" not in text
    assert "RESULTS=/shared/runs/spillway-${PBS_JOBID}" in text
    assert 'echo "spillway: job $PBS_JOBID finished' in text
    assert 'cp "$0" "$RESULTS/job.pbs"' in text
    assert "  # mpiexec passes the signal on to its tasks" in text


def test_the_cluster_inside_is_the_same_as_slurms():
    pbs, slurm = PBS().job_script(OPTIONS, JOB, RUNS), Slurm().job_script(OPTIONS, JOB, RUNS)
    scheduler = line_with(pbs, "-m dask scheduler")
    assert scheduler.startswith("mpiexec -n 1 ")
    assert from_python(scheduler) == from_python(line_with(slurm, "-m dask scheduler"))
    # the workers' command line comes from the same WorkerSpec and options, whatever starts it
    worker = line_with(pbs, "-m spillway worker")
    assert worker.startswith("mpiexec -n 2 --map-by ppr:1:node ")
    assert from_python(worker) == from_python(line_with(slurm, "-m spillway worker"))
    flags = dict(zip(shlex.split(worker), shlex.split(worker)[1:]))
    assert flags["--rmm-pool-size"] == "100000000000" and flags["--memory-store"] == "tiered"
    assert line_with(pbs, "wait-workers") == line_with(slurm, "wait-workers")
    assert '"$PYTHON" -m spillway wait-workers --scheduler-file "$SCHEDULER_FILE"' in line_with(pbs, "wait-workers")
    for i in (1, 2):
        assert line_with(pbs, f"0{i}-transpose-sum.json") == line_with(slurm, f"0{i}-transpose-sum.json")
    # the same script but for the system's own words
    own = {line for line in logical_lines(pbs) if "PBS" in line or "mpiexec" in line or "job.pbs" in line}
    notes = f"{Slurm.scheduler_step_note}\n{Slurm.worker_step_note}".splitlines()
    slurms = {line for line in logical_lines(slurm) if "SBATCH" in line or "srun" in line or "SLURM" in line
              or "job.sbatch" in line or line in notes}
    assert [line for line in logical_lines(pbs) if line not in own] == \
        [line for line in logical_lines(slurm) if line not in slurms]


def test_the_rendered_script_is_valid_bash(tmp_path):
    path = tmp_path / "job.pbs"
    path.write_text(PBS().job_script(Options.resolve(cpu=True, n_workers=4),
                                     JobSettings(nodes=2, time="00:10:00"), RUNS))
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_queue_runs_the_systems_commands():
    shell = FakeShell({"qsub": (0, "4242.pbs01\n"), "qstat": (0, "4242.pbs01|R|00:01:02\n"), "qdel": (0, "")})
    pbs = PBS(shell)
    text = pbs.job_script(OPTIONS, JOB, RUNS)
    assert pbs.submit(text) == "4242.pbs01"
    found = pbs.status("4242.pbs01")
    assert (found.state, found.elapsed, found.source, found.active) == ("R", "00:01:02", "qstat", True)
    pbs.cancel("4242.pbs01")
    assert shell.calls == [(["qsub"], text), (["qstat", "-x", "-F", "dsv", "4242.pbs01"], None),
                           (["qdel", "4242.pbs01"], None)]


def test_queue_errors_are_one_line_in_the_systems_words():
    pbs = PBS(FakeShell({"qsub": (0, "qsub: would exceed queue limit\n"), "qdel": (35, "", "qdel: Unknown Job Id 7.x\n")}))
    with pytest.raises(BatchError, match=r"^qsub printed no job id: 'qsub: would exceed queue limit'$"):
        pbs.submit("#!/bin/bash\n")
    with pytest.raises(BatchError, match=r"^qdel failed \(exit 35\): qdel: Unknown Job Id 7.x$"):
        pbs.cancel("7.x")
    with pytest.raises(BatchError, match=r"^qstat: not found on the PATH; run this on a PBS login node$"):
        pbs.status("7.x")
    with pytest.raises(JobIdError, match=r"job id: '7; rm' is not a PBS job id \(digits.server\)"):
        pbs.cancel("7; rm")
    # a job the queue no longer knows, on a system without a history command
    gone = PBS(FakeShell({"qstat": (153, "", "qstat: Unknown Job Id\n")})).status("8.x")
    assert (gone.state, gone.source, gone.active) == ("UNKNOWN", "none", False)


@pytest.mark.parametrize("options,message", [
    (dict(devices="0,1"), "devices: 0,1 cannot be chosen in a batch job; PBS gives each node's task its GPUs"),
    (dict(scheduler_address="tcp://h:1"),
     "scheduler-address/scheduler-file: a batch job starts its own scheduler; unset them"),
])
def test_the_shared_refusals_speak_for_the_system(options, message):
    with pytest.raises(OptionsError) as e:
        PBS().job_script(Options.resolve(**options), JobSettings(gpus_per_node=2, time="00:10:00"), RUNS)
    assert str(e.value).startswith(message)


def test_mpi_and_the_batch_systems_refuse_through_one_function(monkeypatch):
    """Slurm's job script and MPI's launch call the same refusals, each with its own words."""
    import spillway.launch.batch.batch_system as batch_system
    import spillway.launch.mpi as launch

    seen = []

    def refuse(options, **words):
        seen.append(words["starter"])
        raise OptionsError("refused")

    monkeypatch.setattr(batch_system, "refuse_options", refuse)
    monkeypatch.setattr(launch, "refuse_options", refuse)
    for start in (lambda o: Slurm().job_script(o, JobSettings(gpus_per_node=1, time="10"), RUNS),
                  lambda o: launch.run(o, lambda session: {})):
        with pytest.raises(OptionsError, match="refused"):
            start(Options.resolve())
    assert seen == ["a batch job", "spillway mpi"]
