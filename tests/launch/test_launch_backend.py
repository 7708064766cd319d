"""The launch backends: each plan kind's backend from the registry, the plan and specs
handed to it as resolved, an MPI rank's backend rendering its node's specs into
dask-mpi's keywords (``execute`` replaced by a recorder: no MPI here), and a Slurm batch
job's backend submitting its script (Slurm's commands answered by a stand-in)."""

from __future__ import annotations

import sys
import types

import pytest

from spillway.launch.mpi import MPIRank
from spillway.launch import session as launch
from spillway.launch import TIERED_WORKER, backend_for, store_data, worker_specs
from spillway.launch.backend import BACKENDS, Attach
from spillway.launch.local_cpu import LocalCPU
from spillway.launch.local_gpu import LocalGPU
from spillway.launch.plan import plan
from spillway.launch.spec import HostFacts
from spillway.options.settings import Options
from stand_ins import h200_host, host_probe, node_spec

HOST = 512 * 10**9
FACTS = HostFacts(host_memory_limit=HOST, host_total=HOST)
PLANNED = host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=HOST)


def test_each_plan_kind_has_its_backend():
    assert isinstance(backend_for("gpu"), LocalGPU) and isinstance(backend_for("cpu"), LocalCPU)
    assert isinstance(backend_for("attach"), Attach)
    attach = Options.resolve(scheduler_address="tcp://127.0.0.1:1")
    assert backend_for(plan(attach, h200_host(0), PLANNED).kind).start(attach, plan(attach, h200_host(0), PLANNED),
                                                                       ()) is None  # the client connects itself
    with pytest.raises(ValueError, match=r"launch plan kind 'slurm': no backend starts it \(gpu, cpu, attach\)"):
        backend_for("slurm")


def test_start_cluster_hands_the_backend_the_resolved_plan_and_specs(monkeypatch):
    options = Options.resolve(workers_per_gpu=2, pinned_pool_size="auto")
    gpu_plan = plan(options, h200_host(2), PLANNED)
    specs = worker_specs(options, gpu_plan, FACTS)
    seen = []

    class Recorder:
        def start(self, options, launch_plan, specs):
            seen.append((options, launch_plan, specs))
            return "cluster"

    monkeypatch.setitem(BACKENDS, "gpu", Recorder())
    assert launch.start_cluster(options, gpu_plan, specs) == "cluster"
    assert seen == [(options, gpu_plan, specs)]
    assert [s.device for s in specs] == [0, 0, 1, 1]


class _Comm:
    def __init__(self, rank):
        self.rank = rank

    def Get_rank(self):
        return self.rank


def test_an_mpi_worker_rank_starts_the_worker_of_its_nodes_spec(monkeypatch):
    options = Options.resolve(protocol="tcp", pinned_pool_size="auto", threads_per_worker=3)
    node = plan(options.replace(n_workers=4), h200_host(4), PLANNED)
    specs = worker_specs(options, node, FACTS)
    seen = {}

    def execute(client, *, comm, **kwargs):
        import dask.config

        seen.update(kwargs, comm=comm, spill=dask.config.get("distributed.worker.memory.spill"))

    monkeypatch.setitem(sys.modules, "dask_mpi", types.SimpleNamespace(execute=execute))
    comm = _Comm(rank=2)
    assert MPIRank(lambda session: {"ran": True}, comm=comm, n_workers=4).start(options, node, specs) is None
    spec = node_spec(options, h200_host(4), PLANNED, workers=4, facts=FACTS)
    assert seen["comm"] is comm and seen["worker_class"] == TIERED_WORKER
    assert seen["protocol"] == "tcp" and seen["nthreads"] == 3 and seen["memory_limit"] == spec.memory_limit
    assert seen["worker_options"]["data"] == store_data(spec)
    # the tiered store bounds its own host bytes: the worker's monitor does not spill
    assert seen["spill"] is False


def test_a_slurm_batch_job_is_submitted_through_its_backend(tmp_path):
    """``spillway slurm submit``'s launcher: the script rendered as ``render`` prints it, the
    job's output directory made (sbatch does not), the job id returned; without sbatch on
    the PATH nothing is made."""
    from spillway.launch.slurm_batch import JobSettings, Run, Slurm, SlurmBatch, SlurmError, job_script, submit
    from stand_ins import FakeShell

    options = Options.resolve(cpu=True, n_workers=2)
    job = JobSettings(gpus_per_node=0, time="00:10:00", output_dir=str(tmp_path / "out"))
    runs = [Run("transpose-sum", {"size": "200x200"})]
    shell = FakeShell({"sbatch": (0, "42\n")})
    assert submit(options, job, runs, system=Slurm(shell)) == "42"
    assert shell.calls == [(["sbatch", "--parsable"], job_script(options, job, runs))]
    assert (tmp_path / "out").is_dir()
    elsewhere = JobSettings(gpus_per_node=0, time="00:10:00", output_dir=str(tmp_path / "not-made"))
    with pytest.raises(SlurmError, match="sbatch: not found on the PATH"):
        SlurmBatch(elsewhere, runs, system=Slurm(FakeShell({}))).start(options, plan(options, h200_host(0), PLANNED), ())
    assert not (tmp_path / "not-made").exists()
