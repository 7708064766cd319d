"""Parsing Slurm's answers (the batch seam's generic parsing driven by Slurm's class
attributes) and the ``spillway slurm`` command line (no Slurm needed)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from spillway.cli import main
from spillway.launch.batch import JobIdError
from spillway.launch.slurm_batch import Slurm, SlurmError
from stand_ins import FakeShell

SLURM = Slurm()


def test_sbatch_parsable_output():
    assert SLURM.job_id_from_submit("1234\n") == "1234"
    assert SLURM.job_id_from_submit("1234;cluster-a\n") == "1234"
    with pytest.raises(SlurmError, match="sbatch printed no job id"):
        SLURM.job_id_from_submit("sbatch: error: Batch job submission failed\n")


def test_squeue_and_sacct_lines():
    found = SLURM.parse_status("17|RUNNING|1:02|5:00|2|node[1-2]\n", "17")
    assert found.state == "RUNNING" and found.nodes == "2" and found.active
    assert SLURM.parse_status("18|RUNNING|1:02|5:00|2|n1\n", "17") is None
    done = SLURM.parse_history("17|CANCELLED by 0|00:00:09|0:15\n17.batch|CANCELLED|00:00:09|0:15\n", "17")
    assert done.state == "CANCELLED" and done.exit_code == "0:15" and not done.active


def test_slurm_commands_and_their_arguments():
    """What the seam runs for Slurm: sbatch with the script on stdin, squeue, then sacct
    once the job has left the queue (where sacct is installed), scancel."""
    shell = FakeShell({"sbatch": (0, "17\n"), "squeue": (0, ""), "sacct": (0, "17|COMPLETED|00:00:09|0:0\n"),
                       "scancel": (0, "")})
    slurm = Slurm(shell)
    assert slurm.submit("#!/bin/bash\n") == "17"
    done = slurm.status("17")
    assert (done.state, done.source, done.active) == ("COMPLETED", "sacct", False)
    slurm.cancel("17")
    assert shell.calls == [
        (["sbatch", "--parsable"], "#!/bin/bash\n"),
        (["squeue", "-h", "-j", "17", "--states=all", "-o", "%i|%T|%M|%l|%D|%R"], None),
        (["sacct", "-n", "-P", "-j", "17", "-o", "JobID,State,Elapsed,ExitCode"], None),
        (["scancel", "17"], None),
    ]
    running = Slurm(FakeShell({"squeue": (0, "18|PENDING|0:00|5:00|1|(Priority)\n")})).status("18")
    assert running.to_json() == {"job_id": "18", "state": "PENDING", "elapsed": "0:00", "time_limit": "5:00",
                                 "nodes": "1", "reason": "(Priority)", "exit_code": None, "source": "squeue",
                                 "active": True}
    # no accounting: a job gone from the queue is unknown, not an error
    gone = Slurm(FakeShell({"squeue": (1, "", "slurm_load_jobs error: Invalid job id specified\n")})).status("19")
    assert (gone.state, gone.source) == ("UNKNOWN", "none")
    with pytest.raises(SlurmError, match=r"^scancel failed \(exit 1\): scancel: error: Kill job error$"):
        Slurm(FakeShell({"scancel": (1, "", "scancel: error: Kill job error\n")})).cancel("20")


@pytest.mark.parametrize("bad", ["", "12a", "-1", "12 13", "1;scancel"])
def test_bad_job_ids_stop_with_one_line(bad):
    with pytest.raises(JobIdError) as e:
        SLURM.check_job_id(bad)
    assert "is not a Slurm job id" in str(e.value)
    assert SLURM.check_job_id("123_4") == "123_4"


def test_cli_render_prints_the_script(tmp_path):
    result = CliRunner().invoke(main, [
        "slurm", "render", "transpose-sum", "--param", "size=2000x2000", "--nodes", "2", "--gpus-per-node", "4",
        "--time", "01:00:00", "--partition", "gpu", "--account", "proj", "--output-dir", str(tmp_path),
        "--python", "/opt/venv/bin/python", "--rmm-pool-size", "20GB",
    ])
    assert result.exit_code == 0, result.output
    text = result.output
    assert text.startswith("#!/usr/bin/env bash\n#SBATCH --job-name=spillway-transpose-sum\n")
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --account=proj" in text
    assert f"#SBATCH --output={tmp_path}/spillway-%j.out" in text
    assert "--rmm-pool-size 20000000000" in text and "PYTHON=/opt/venv/bin/python" in text
    assert "--params-json '{\"size\": \"2000x2000\"}'" in text


@pytest.mark.parametrize("args,message", [
    (["--time", "1:75:00"], "spillway: error: time: '1:75:00' has minutes or seconds above 59"),
    (["--nodes", "0"], "spillway: error: nodes: 0 must be an integer in [1, 100000]"),
    (["--param", "size=0x0"], "spillway: error: size"),
    (["--param", "sise=10"], "spillway: error: sise: not a parameter of transpose-sum"),
    (["--rmm-pool-size", "lots"], "spillway: error: rmm-pool-size"),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, message):
    base = {"--nodes": "1", "--gpus-per-node": "2", "--time": "00:10:00"}
    flags = []
    for key, value in base.items():
        if key not in args:
            flags += [key, value]
    result = CliRunner().invoke(main, ["slurm", "render", "transpose-sum", *flags, *args])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(message)
    assert result.output.count("\n") == 1


def test_cli_unknown_workflow_stops_before_rendering():
    result = CliRunner().invoke(main, ["slurm", "render", "transpose-summ", "--nodes", "1", "--gpus-per-node", "1",
                                       "--time", "00:10:00"])
    assert result.exit_code == 2
    assert "workflow 'transpose-summ' is unknown (did you mean transpose-sum?)" in result.output


def test_cli_status_without_slurm_names_the_missing_command(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    result = CliRunner().invoke(main, ["slurm", "status", "12"])
    assert result.exit_code == 2  # the machine is the user's to change
    assert result.output.strip() == "spillway: error: squeue: not found on the PATH; run this on a Slurm login node"


def test_readme_example_is_what_render_prints():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Slurm batch analyses", 1)[1]
    command = section.split("The script `", 1)[1].split("` prints:", 1)[0]
    example = section.split("```bash\n", 1)[1].split("```\n", 1)[0]
    args = command.replace("\n", " ").split()
    assert args[:3] == ["spillway", "slurm", "render"]
    result = CliRunner().invoke(main, args[1:])
    assert result.exit_code == 0, result.output
    # (stderr says the output directory is not on this machine)
    assert result.stdout == example


def test_cli_then_adds_runs_and_checks_their_parameters():
    base = ["slurm", "render", "transpose-sum", "--nodes", "1", "--gpus-per-node", "1", "--time", "00:10:00"]
    result = CliRunner().invoke(main, base + ["--then", '[{"workflow": "transpose-sum", "params": {"seed": 2}}]'])
    assert result.exit_code == 0, result.output
    assert '>"$RESULTS/02-transpose-sum.json"' in result.output
    bad = CliRunner().invoke(main, base + ["--then", '[{"workflow": "transpose-sum", "params": {"sed": 2}}]'])
    assert bad.exit_code == 2
    assert bad.output.strip() == "spillway: error: sed: not a parameter of transpose-sum (did you mean seed?)"


def test_wait_workers_is_a_command_of_its_own():
    """The script calls `spillway wait-workers`; `spillway slurm wait-workers`, which older
    scripts call, still answers but is left out of the help."""
    top = CliRunner().invoke(main, ["--help"])
    assert "wait-workers" in top.output and "mpi" in top.output
    assert "wait-workers" not in CliRunner().invoke(main, ["slurm", "--help"]).output
    for args in (["wait-workers"], ["slurm", "wait-workers"]):
        result = CliRunner().invoke(main, [*args, "--help"])
        assert result.exit_code == 0, result.output
        assert "--scheduler-file" in result.output and "--workers" in result.output
        missing = CliRunner().invoke(main, [*args, "--workers", "2"])
        assert missing.exit_code == 2 and "--scheduler-file" in missing.output
