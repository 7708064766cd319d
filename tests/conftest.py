"""Shared test setup: GPU tests skip themselves where there is no usable GPU."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

# --import-mode=importlib puts no test folder on sys.path: the shared stand-ins live in
# their own folder (tests/ itself holds folders named like the packages under test)
sys.path.append(str(Path(__file__).parent / "helpers"))

# Keep the GPU host's NVLink-multicast guards in every process the tests start.
for _var, _value in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                     "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ.setdefault(_var, _value)


def _gpu_count() -> int:
    if importlib.util.find_spec("cupy") is None or importlib.util.find_spec("dask_cuda") is None:
        return 0
    from spillway.options.gpus import discover

    return len(discover())


GPU_COUNT = _gpu_count()


def pytest_collection_modifyitems(config, items):
    if GPU_COUNT:
        return
    skip = pytest.mark.skip(reason="needs a GPU with CuPy and dask-cuda installed")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gpu_count():
    return GPU_COUNT


@pytest.fixture
def no_cluster(monkeypatch):
    """Fails the test where a cluster would start: what must be refused before one starts
    is shown to be, whatever the machine's speed."""
    from spillway import launch

    def started(*args, **kwargs):
        raise AssertionError("a cluster started")

    monkeypatch.setattr(launch, "open_cluster", started)


@pytest.fixture(autouse=True)
def _no_distributed_scheduler_without_a_client():
    """No test starts with dask's config naming the distributed scheduler while no client
    is there to be it. distributed sets ``scheduler: dask.distributed`` when a client
    becomes the default and restores what it found when that client closes: clients of
    one process closed in another order than they were made (an earlier file's, in this
    xdist process) leave it set with none open, and a plain ``dask.compute`` then fails."""
    import dask

    if dask.config.get("scheduler", None) in ("dask.distributed", "distributed"):
        try:
            from distributed import Client

            Client.current(allow_global=True)
        except ValueError:
            dask.config.config.pop("scheduler", None)
    yield


@pytest.fixture(autouse=True)
def _gpu_memory_given_back(request):
    """A GPU test that used CuPy in the test process gives the pool's cached blocks back:
    the next test's cluster sizes its pools from what is free on the GPU, and the blocks
    an earlier test left cached here (17.8 GB on one H200 after the collective's kernel
    tests) read as memory held by another process, which the launch rightly refuses."""
    yield
    if "gpu" not in request.keywords or "cupy" not in sys.modules:
        return
    cupy = sys.modules["cupy"]
    try:
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
    except Exception:  # no device in this process after all: nothing was cached
        pass
