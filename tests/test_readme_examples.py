"""The READMEs' examples run as written: every shell and Python block of README.md and
examples/README.md is either run here, on CPU, in a fresh directory (with ``spillway`` and
this checkout first on the paths), or named below with why it cannot run on a CPU machine
(and which test runs it where one does). A block that is neither fails the test, so a new
example is run or its reason written down.

A block may say so itself, on the line before its fence: ``<!-- readme-example: not here:
REASON -->``. A Python block is run as a script where it has a ``__main__`` guard, else as
a notebook runs a cell (``python -c``: no script for the workers to import again); a shell
block with bash -e, lines that need what this machine has not (a Slurm cluster, a service)
left out where the block says which. The
systemd block runs as root would run it, with the machine's directories under a temporary
one and stand-ins for the commands that change the machine (``SANDBOXED``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READMES = ("README.md", "examples/README.md")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
#: a block's own word that it does not run here, and why, on the line before its fence
MARKER = re.compile(r"<!-- readme-example: not here: ([^\n]+?) -->\n\Z")


@dataclass(frozen=True)
class Block:
    readme: str
    line: int
    language: str
    text: str
    #: the reason its marker gives, where it has one
    not_here: str | None = None

    @property
    def id(self) -> str:
        return f"{self.readme}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for readme in READMES:
        text = (ROOT / readme).read_text()
        for match in FENCE.finditer(text):
            marker = MARKER.search(text, max(0, match.start() - 2000), match.start())
            found.append(Block(readme, text[:match.start()].count("\n") + 1, match.group(1), match.group(2),
                               " ".join(marker.group(1).split()) if marker else None))
    return found


#: blocks that run here, by a piece of their text -> the lines of theirs that run (a
#: prefix each starts with; None: the whole block)
RUN: dict[str, tuple[str, ...] | None] = {
    'with spillway.local() as cluster:': None,
    'with spillway.local(cpu=True) as cluster:': None,
    'cluster.scale(3)': None,
    'spillway tenant add alice ': ("spillway tenant",),
    'cp spillway/launch/srun bin/': None,
    'mpirun -n 3 --oversubscribe spillway mpi': ("mpirun",),
    'useradd --system --user-group': None,
}

#: blocks that cannot run on this machine as written, by a piece of their text -> why
NOT_HERE: dict[str, str] = {
    "pip install -e \".[${v:+cuda}${v:-cpu}]\"": "the install command: .ci/run runs the test command, which installs the same way",
    'pip install -q -e ".[test]"': "the test command itself (.ci/run runs it)",
    "spillway run WORKFLOW [--param K=V ...]": "a synopsis (WORKFLOW and F are placeholders)",
    'service = spillway.connect("http://127.0.0.1:8000", token)': "GPU: a 108 GB job (1.35x an 80 GB GPU) on a "
                                                                     "running service with a "
                                                                     "tenant's token; tests/service/test_client.py",
    "curl -H \"Authorization: Bearer $TOKEN\"": "needs a running service and a tenant's token; tests/service/api "
                                                "submits the same body",
    "OUTPUT_DIR/spillway-JOBID.out": "a listing of a job's files",
    "spillway slurm render WORKFLOW [--param K=V ...]": "a synopsis (WORKFLOW, N, G are placeholders)",
    "#!/usr/bin/env bash": "the rendered script, compared with what render prints by tests/launch/test_slurm_queue.py",
    "spillway bench --sizes full --only W1,B2": "GPU sizes; the CPU smoke run is tests/bench/test_bench.py",
    "bash benchmarks/gpu-host/conformance.sh": "dask's CuPy tests on a GPU host",
    "cluster = spillway.slurm(gpus_per_node=4": "GPU nodes of a Slurm cluster; tests/launch/test_slurm_cluster.py "
                                                "runs the same calls on the suite's loopback Slurm",
}


def _classify(block: Block) -> tuple[str, object]:
    if block.not_here:
        return "skip", block.not_here
    runs = [key for key in RUN if key in block.text]
    skips = [key for key in NOT_HERE if key in block.text]
    assert len(runs) + len(skips) == 1, (
        f"{block.id}: a block the test does not know ({block.text.splitlines()[0][:80]!r}): run it (RUN) "
        f"or say why it cannot run on CPU (NOT_HERE)" if not runs + skips else
        f"{block.id}: matched by more than one entry: {runs + skips}")
    return ("run", RUN[runs[0]]) if runs else ("skip", NOT_HERE[skips[0]])


def test_every_block_is_run_or_said_why_not():
    seen = {"run": set(), "skip": set()}
    for block in blocks():
        what, _ = _classify(block)
        if block.not_here:
            assert not [k for k in (*RUN, *NOT_HERE) if k in block.text], f"{block.id}: marked and listed"
            continue
        key = next(k for k in (*RUN, *NOT_HERE) if k in block.text)
        seen[what].add(key)
    assert seen["run"] == set(RUN) and seen["skip"] == set(NOT_HERE), "an entry matches no block any more"


def _environment(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPILLWAY_", "DASK_SPILLWAY"))}
    bin_dir = os.path.dirname(sys.executable)
    env.update({
        "PATH": os.pathsep.join([bin_dir, env.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        "HOME": str(tmp_path / "home"),  # the tenants' default state directory goes here
        "SPILLWAY_STATE_DIR": str(tmp_path / "state"),
        # mpirun as the CI's root: the README names the flag root needs in the line above
        # its block (the block itself asks for --oversubscribe)
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    })
    return env


RUNNABLE = [b for b in blocks() if _classify(b)[0] == "run"]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_the_block_runs_as_written(block, tmp_path):
    _, lines = _classify(block)
    here = tmp_path / "work"
    here.mkdir()
    # the blocks name the checkout's files by their paths from its root
    (here / "spillway").symlink_to(ROOT / "spillway")
    env = _environment(tmp_path)
    sandbox = None
    if block.language == "python" and '__name__ == "__main__"' not in block.text:
        args = [sys.executable, "-c", block.text]  # a notebook's cell: no script to import again
    elif block.language == "python":
        (here / "example.py").write_text(block.text)
        args = [sys.executable, "example.py"]
    else:
        text = block.text if lines is None else _only(block.text, lines)
        if any(key in text for key in SANDBOXED):
            sandbox = tmp_path / "root"
            text = _sandboxed(text, sandbox, env)
        if "mpirun" in text and shutil.which("mpirun", path=env["PATH"]) is None:
            pytest.skip("no mpirun (the mpi-local extra brings one)")
        args = ["bash", "-e", "-o", "pipefail", "-c", text]
    done = subprocess.run(args, cwd=here, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, f"{block.id} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    if "job.sbatch" in block.text:
        report = here / "out" / "spillway-1" / "01-rechunk.json"
        assert '"ok": true' in report.read_text(), report.read_text()[-2000:]
    if "mpirun" in block.text:
        # the report alone: no log line or shutdown traceback of the ranks around it
        # (a warning may remain: the dashboard's port taken by another cluster on this machine)
        assert done.stdout.startswith('{"workflow": "transpose-sum"'), done.stdout[-3000:]
        assert "Traceback" not in done.stderr and " - INFO - " not in done.stderr, done.stderr[-3000:]
    if sandbox is not None:
        _check_systemd_install(sandbox)


#: blocks run in a sandbox (a piece of their text): the machine's directories they write
#: under a temporary root, and the commands that would change the machine replaced
SANDBOXED = ("useradd --system",)
MACHINE_DIRS = ("/etc/", "/opt/", "/var/lib/")


def _sandboxed(text: str, root: Path, env: dict) -> str:
    """``text`` with the machine's directories under ``root`` and stand-ins first on the
    PATH (``env`` is changed): ``id`` knows no user, ``useradd`` and ``systemctl`` record
    their arguments, and ``python3 -m venv DIR`` makes a venv whose ``python`` and
    ``spillway`` are this test's and whose ``pip`` records what it was asked to install."""
    for d in MACHINE_DIRS:
        (root / d.strip("/")).mkdir(parents=True, exist_ok=True)
        text = text.replace(d, f"{root}{d}")
    (root / "etc" / "systemd" / "system").mkdir(parents=True)  # where systemd is, it is there
    bin_dir = root / "stand-ins"
    bin_dir.mkdir()
    real_bin = os.path.dirname(sys.executable)
    scripts = {
        "id": "exit 1",
        "useradd": f'echo "$@" >> {root}/useradd.log',
        "systemctl": f'echo "$@" >> {root}/systemctl.log',
        "python3": f"""if [ "$1" = -m ] && [ "$2" = venv ]; then
  mkdir -p "$3/bin" && ln -s {real_bin}/spillway "$3/bin/spillway"
  printf '#!/bin/sh\nexec {sys.executable} "$@"\n' > "$3/bin/python"
  printf '#!/bin/sh\necho "$@" >> {root}/pip.log\n' > "$3/bin/pip" && chmod +x "$3/bin/python" "$3/bin/pip"
else
  exec {sys.executable} "$@"
fi""",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env["PATH"] = os.pathsep.join([str(bin_dir), env["PATH"]])
    return text


def _check_systemd_install(root: Path) -> None:
    """What the systemd block leaves: the unit's user, its venv's spillway, the environment
    file it names, the unit itself, and systemd told to start it."""
    unit = (root / "etc/systemd/system/spillway.service").read_text()
    settings = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert (root / settings["EnvironmentFile"].lstrip("/")).is_file()
    assert "DASK_SPILLWAY__RMM_POOL_SIZE=" in (root / settings["EnvironmentFile"].lstrip("/")).read_text()
    executable = settings["ExecStart"].split()[0]
    assert os.access(root / executable.lstrip("/"), os.X_OK), executable
    assert (root / "pip.log").read_text().split() == ["install", "-q", ".[service]"]
    assert (root / "useradd.log").read_text().split()[-1] == settings["User"] == "spillway"
    assert (root / "systemctl.log").read_text().splitlines() == ["daemon-reload", "enable --now spillway"]


def _only(text: str, prefixes: tuple[str, ...]) -> str:
    """The block's commands that start with one of ``prefixes`` (continuation lines kept)."""
    kept, keep = [], False
    for line in text.splitlines():
        if not keep:
            keep = line.startswith(prefixes)
        if keep:
            kept.append(line)
        keep = keep and line.rstrip().endswith("\\")
    return "\n".join(kept) + "\n"


def test_the_commands_block_names_every_command():
    """The README's synopsis of the CLI leaves no command out."""
    from click.testing import CliRunner

    from spillway.cli import main

    synopsis = next(b.text for b in blocks() if "spillway run WORKFLOW [--param K=V ...]" in b.text)
    named = {line.split()[1] for line in synopsis.splitlines() if line.startswith("spillway ")}
    listed = CliRunner().invoke(main, ["--help"]).output.split("Commands:", 1)[1]
    commands = {line.split()[0] for line in listed.splitlines() if line.strip()}
    assert commands - named == set(), f"the README's Commands block leaves out {sorted(commands - named)}"
