"""`spillway mpi` GPU worker ranks with spillway's tiered store: the worker class dask-mpi
starts, and the store spec a rank builds from its node (its share of the host)."""

from __future__ import annotations

import pytest

from spillway.launch.mpi import TIERED_WORKER, execute_kwargs, worker_class
from spillway.launch import gpu_worker, render, worker_store
from spillway.launch.plan import PINNED_HOST_FRACTION
from spillway.options.settings import Options
from stand_ins import h200_host, host_probe, node_spec

HOST = 2 * 10**12


inventory = h200_host


@pytest.mark.parametrize("options, expected", [
    (dict(), TIERED_WORKER),
    (dict(memory_store="dask-cuda"), "dask_cuda.CUDAWorker"),
    (dict(rmm_managed_memory=True, nvlink=False), "dask_cuda.CUDAWorker"),
    (dict(cpu=True), "distributed.Nanny"),
])
def test_the_store_picks_the_worker_class(options, expected):
    opts = Options.resolve(**options)
    assert worker_class(opts) == expected
    assert execute_kwargs(opts, n_workers=8)["worker_class"] == expected
    # the data spec is the rank's, never part of the shared keywords
    assert "data" not in execute_kwargs(opts, n_workers=8)["worker_options"]


def test_tiered_worker_class_is_found_by_its_import_path_without_importing_gpu_libraries():
    module, _, name = TIERED_WORKER.rpartition(".")
    assert module == gpu_worker.__name__ and name == "TieredCUDAWorker"


def test_a_rank_takes_its_share_of_its_node():
    """Four worker ranks on a node: each rank's store may pin a quarter of half the host,
    like one of four local workers, though the rank sees one GPU."""
    opts = Options.resolve(pinned_pool_size="auto", memory_limit="100GB").replace(protocol="ucx")
    host = host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=HOST)
    func, kwargs = render.store_data(node_spec(opts, workers=4, inventory=inventory(4), host=host))
    assert func is worker_store.build_store and kwargs["protocol"] == "ucx"
    assert kwargs["pinned_limit"] == int(PINNED_HOST_FRACTION * HOST) // 4
    from distributed.system import MEMORY_LIMIT

    limit = min(100 * 10**9, MEMORY_LIMIT)  # distributed caps it at this machine's
    # less the process's own memory and its share of what the machine keeps free
    assert limit // 2 <= kwargs["host_limit"] < limit
    assert kwargs["pinned_pool_size"] == min(kwargs["pinned_limit"], kwargs["host_limit"])


def test_visible_gpus_counts_what_slurm_gave_the_task(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_worker.visible_gpus() is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,GPU-abc")
    assert gpu_worker.visible_gpus() == 3


@pytest.mark.gpu
def test_tiered_worker_is_dask_cudas_worker():
    from dask_cuda import CUDAWorker
    from distributed.utils import import_term

    assert issubclass(import_term(TIERED_WORKER), CUDAWorker)
