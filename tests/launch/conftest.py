"""A real one-node Slurm for the batch tests: munged, slurmctld and slurmd on loopback,
started from a minimal configuration in a temporary directory and stopped afterwards.

The fixture skips only where the Slurm or MUNGE binaries are absent
(``.ci/setup.d/slurm.sh`` installs them in CI).
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "srun", "sinfo")
START_TIMEOUT_S = 60


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    env: dict

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)


def _binary(name: str) -> str | None:
    # the daemons live in sbin, which a non-root PATH may not hold
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/sbin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    # the daemons end with the test session even when pytest itself is killed
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _start(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    with log.open("ab") as out:
        return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


def _write_config(root: Path, user: str) -> Path:
    conf = root / "slurm.conf"
    conf.write_text(f"""\
ClusterName=spillwaytest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=300
NodeName=localhost NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} RealMemory=1 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
""")
    return conf


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    missing = [name for name in BINARIES if _binary(name) is None]
    if missing:
        pytest.skip(f"Slurm/MUNGE not installed ({', '.join(missing)} missing; see .ci/setup.d/slurm.sh)")
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir()
    (root / "munge").chmod(0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = _write_config(root, getpass.getuser())
    env = {**os.environ, "SLURM_CONF": str(conf)}
    log = root / "log"
    daemons: list[subprocess.Popen] = []
    try:
        # in the foreground (-F, -D) so they are this session's children and stop with it
        daemons.append(_start([_binary("munged"), "--foreground", "--force",
                               f"--socket={root}/munge/munge.socket", f"--key-file={key}",
                               f"--pid-file={root}/munge/munged.pid", f"--seed-file={root}/munge/seed",
                               f"--log-file={log}/munged.log"], env, log / "munged.out"))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (root / "munge" / "munge.socket").exists():
            if time.monotonic() > deadline or daemons[0].poll() is not None:
                pytest.fail(f"munged did not start:\n{(log / 'munged.out').read_text()[-2000:]}")
            time.sleep(0.1)
        daemons.append(_start([_binary("slurmctld"), "-D", "-f", str(conf)], env, log / "slurmctld.out"))
        daemons.append(_start([_binary("slurmd"), "-D", "-f", str(conf), "-N", "localhost"], env,
                              log / "slurmd.out"))
        cluster = SlurmCluster(root=root, conf=conf, env=env)
        state = ""
        while time.monotonic() < deadline:
            state = cluster.run("sinfo", "-h", "-o", "%T", timeout=10).stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        else:
            logs = "".join(p.read_text()[-2000:] for p in log.iterdir())
            pytest.fail(f"Slurm node not idle after {START_TIMEOUT_S}s (state {state!r}):\n{logs}")
        yield cluster
        # nothing of the tests may outlive them
        cluster.run("scancel", "--user", getpass.getuser(), timeout=30)
    finally:
        for proc in reversed(daemons):
            _stop(proc)
