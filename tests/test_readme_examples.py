"""The READMEs' examples run as written: every shell and Python block of README.md and
examples/README.md is either run here, on CPU, in a fresh directory (with ``spillway`` and
this checkout first on the paths), or named below with why it cannot run on a CPU machine
(and which test runs it where one does). A block that is neither fails the test, so a new
example is run or its reason written down.

A Python block is run as a script; a shell block with bash -e, lines that need what this
machine has not (a Slurm cluster, a service) left out where the block says which.
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


@dataclass(frozen=True)
class Block:
    readme: str
    line: int
    language: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.readme}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for readme in READMES:
        text = (ROOT / readme).read_text()
        for match in FENCE.finditer(text):
            found.append(Block(readme, text[:match.start()].count("\n") + 1, match.group(1), match.group(2)))
    return found


#: blocks that run here, by a piece of their text -> the lines of theirs that run (a
#: prefix each starts with; None: the whole block)
RUN: dict[str, tuple[str, ...] | None] = {
    'with spillway.local(cpu=True) as cluster:': None,
    'cluster.scale(3)': None,
    'spillway tenant add alice ': ("spillway tenant",),
    'cp spillway/deploy/slurm/srun bin/': None,
    'mpirun -n 3 spillway mpi': ("mpirun",),
}

#: blocks that cannot run on this machine as written, by a piece of their text -> why
NOT_HERE: dict[str, str] = {
    "pip install -e \".[${v:+cuda}${v:-cpu}]\"": "the install command: .ci/run runs the test command, which installs the same way",
    'pip install -q -e ".[test]"': "the test command itself (.ci/run runs it)",
    'with spillway.local(rmm_pool_size="20GB")': "sizes of a GPU host (200 GB) and a service URL; the script blocks "
                                                 "and examples/*.ipynb (tests/examples) run these calls on CPU",
    "spillway run WORKFLOW [--param K=V ...]": "a synopsis (WORKFLOW and F are placeholders)",
    'service = spillway.connect("http://127.0.0.1:8765", token)': "a 108 GB job on a running service with a "
                                                                     "tenant's token; tests/service/test_client.py",
    "curl -H \"Authorization: Bearer $TOKEN\"": "needs a running service and a token; tests/service/api",
    "OUTPUT_DIR/spillway-JOBID.out": "a listing of a job's files",
    "spillway slurm render WORKFLOW [--param K=V ...]": "a synopsis (WORKFLOW, N, G are placeholders)",
    "#!/usr/bin/env bash": "the rendered script, compared with what render prints by tests/deploy/test_slurm_queue.py",
    "python -c \"from spillway.deploy.systemd import environment_file": "installs into /etc and systemd; "
                                                                       "tests/deploy/test_systemd.py renders both files",
    "spillway bench --sizes full --only W1,B2": "GPU sizes; the CPU smoke run is tests/bench/test_bench.py",
    "bash benchmarks/gpu-host/conformance.sh": "dask's CuPy tests on a GPU host",
    "cluster = spillway.slurm(gpus_per_node=4": "GPU nodes of a Slurm cluster; tests/deploy/test_slurm_cluster.py "
                                                "runs the same calls on the suite's loopback Slurm",
}


def _classify(block: Block) -> tuple[str, object]:
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
        # mpirun as the CI's root, on more ranks than its 2 cores (as tests/deploy/test_mpi.py)
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_rmaps_base_oversubscribe": "1", "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
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
    if block.language == "python":
        (here / "example.py").write_text(block.text)
        args = [sys.executable, "example.py"]
    else:
        text = block.text if lines is None else _only(block.text, lines)
        if "mpirun" in text and shutil.which("mpirun", path=env["PATH"]) is None:
            pytest.skip("no mpirun (the mpi-local extra brings one)")
        args = ["bash", "-e", "-o", "pipefail", "-c", text]
    done = subprocess.run(args, cwd=here, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, f"{block.id} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    if "job.sbatch" in block.text:
        report = here / "out" / "spillway-1" / "01-rechunk.json"
        assert '"ok": true' in report.read_text(), report.read_text()[-2000:]


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
