"""Machines described for tests of pure functions (plans, worker keywords, store specs),
and a batch system's commands answered without the batch system."""

from __future__ import annotations

import dataclasses
import subprocess

from spillway.options.gpus import GPU, Inventory
from spillway.launch.local_gpu import specs_kwargs
from spillway.launch.plan import HostProbe
from spillway.launch.gpu_worker import node_plan
from spillway.launch.spec import one_for_all, worker_specs


def h200_host(n: int, *, links: int = 0) -> Inventory:
    """``n`` H200-sized GPUs, each pair joined by ``links`` NVLinks (none: no peer links)."""
    gpus = tuple(
        GPU(index=i, uuid=f"GPU-{i:08x}-aaaa", name="Test GPU", memory_total=141 * 10**9,
            memory_free=140 * 10**9, pci_bus_id=f"00000000:{i:02x}:00.0",
            nvlinks={j: links for j in range(n) if j != i} if links else {})
        for i in range(n)
    )
    return Inventory(gpus, "580.00", "13.0", None if n else "NVML found no GPU")


def gpu_cluster_kwargs(options, plan, facts=None) -> dict:
    """The LocalCUDACluster keywords the local GPU launcher passes for ``plan``: its
    workers' specs (on a host of ``facts``, this machine's when not given) rendered."""
    return specs_kwargs(options, worker_specs(options, plan, facts))


def host_probe(**facts) -> HostProbe:
    """This machine's :class:`HostProbe` with ``facts`` in place of what it read (the
    libraries installed, the cores, the host's memory)."""
    return dataclasses.replace(HostProbe.here(), **facts)


def node_spec(options, inventory, host, *, workers=None, facts=None):
    """The one spec a node's ``workers`` GPU workers are started with (``spillway worker``'s
    :class:`NodeWorkers`, an MPI rank), its node planned from ``inventory`` and ``host``."""
    return one_for_all(worker_specs(options, node_plan(options, inventory, host, workers=workers), facts))


class FakeShell:
    """A batch system's commands (:class:`spillway.launch.batch.Shell`) answered from
    ``answers``, command name -> (exit status, stdout[, stderr]); a name not there is not
    on the PATH. Every call is kept in ``calls`` as (argv, stdin), argv starting with the
    bare name."""

    timeout_s = 60

    def __init__(self, answers: dict[str, tuple]):
        self.answers = answers
        self.calls: list[tuple[list[str], str | None]] = []

    def which(self, name: str) -> str | None:
        return name if name in self.answers else None

    def run(self, args, *, input=None) -> subprocess.CompletedProcess:
        self.calls.append((list(args), input))
        code, out, *err = self.answers[args[0]]
        return subprocess.CompletedProcess(list(args), code, out, err[0] if err else "")


class OtherSession:
    """A spillway session's client on a scheduler at ``address`` that no test client is of:
    what :func:`spillway.datapath.collective.method.use_on` routes for, in this process."""

    status = "running"

    def __init__(self, address: str):
        self.scheduler = type("Scheduler", (), {"address": address})()
