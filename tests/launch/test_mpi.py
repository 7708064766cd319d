"""``spillway mpi``: which GPU each rank takes, the worker keywords, and a real run of
transpose-sum under mpirun with CPU workers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

from reference_inputs import uniform_numpy
from spillway.launch.mpi import check_world, device_for_rank, execute_kwargs, worker_options
from spillway.options.errors import OptionsError
from spillway.options.settings import Options
from spillway.workflows.workflow import relative_error


def test_worker_ranks_take_distinct_gpus_of_their_node():
    # node 0 holds ranks 0 (scheduler) to 4, node 1 ranks 5 to 8; 4 GPUs each
    node0, node1 = [0, 1, 2, 3, 4], [5, 6, 7, 8]
    gpus = [0, 1, 2, 3]
    assert [device_for_rank(r, node0, gpus) for r in node0[1:]] == [0, 1, 2, 3]
    assert [device_for_rank(r, node1, gpus) for r in node1] == [0, 1, 2, 3]
    assert device_for_rank(6, node1, ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]) == "GPU-b"


def test_more_ranks_than_gpus_on_a_node_is_one_line_error():
    with pytest.raises(OptionsError) as e:
        device_for_rank(3, [0, 1, 2, 3], [0, 1])
    assert str(e.value).startswith("mpi: rank 3 is worker 3 on its node but the node has 2 GPU(s)")


def test_world_needs_a_worker_rank():
    assert check_world(9) == 8
    with pytest.raises(OptionsError, match="mpi: 1 rank"):
        check_world(1)


def test_gpu_worker_keywords_come_from_the_options():
    options = Options.resolve(rmm_pool_size="10GB", device_memory_limit=0.7, threads_per_worker=2)
    kwargs = execute_kwargs(options, n_workers=8)
    assert kwargs["worker_class"] == "spillway.launch.gpu_worker.TieredCUDAWorker"  # the default tiered store
    assert kwargs["protocol"] == "ucx" and kwargs["nthreads"] == 2
    assert kwargs["client_rank"] == kwargs["scheduler_rank"] == 0 and kwargs["exclusive_workers"]
    worker = kwargs["worker_options"]
    assert worker["rmm_pool_size"] == 10_000_000_000 and worker["device_memory_limit"] == 0.7
    assert worker["rmm_allocator_external_lib_list"] == ["cupy"] and worker["enable_nvlink"] is True


def test_cpu_worker_keywords():
    options = Options.resolve(cpu=True, memory_limit="1GB")
    kwargs = execute_kwargs(options, n_workers=2)
    assert kwargs["worker_class"] == "distributed.Nanny" and kwargs["protocol"] == "tcp"
    assert kwargs["memory_limit"] == 1_000_000_000
    assert kwargs["worker_options"] == worker_options(None) == {}


@pytest.mark.parametrize("options,message", [
    (dict(devices="0,1"), "devices: 0,1 cannot be chosen under MPI"),
    (dict(scheduler_address="tcp://h:1"), "scheduler-address/scheduler-file: spillway mpi starts its own"),
])
def test_launch_refuses_options_it_cannot_honour(options, message):
    from spillway.launch import mpi as launch

    with pytest.raises(OptionsError) as e:
        launch.run(Options.resolve(**options), lambda session: {})
    assert str(e.value).startswith(message)


def _open_mpi() -> str | None:
    # the test extra's Open MPI wheel puts mpirun beside this interpreter, which a plain
    # `.venv/bin/python -m pytest` does not put on PATH; it is also the launcher that matches
    # the libmpi mpi4py loads (the venv's before the system's)
    mpirun = shutil.which("mpirun", path=sysconfig.get_path("scripts")) or shutil.which("mpirun")
    if mpirun is None:
        return None
    done = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    return mpirun if "Open MPI" in done.stdout + done.stderr else None


def _mpirun_or_skip() -> str:
    pytest.importorskip("dask_mpi")
    mpirun = _open_mpi()
    if mpirun is None:
        pytest.skip("Open MPI's mpirun is not installed (the test extra brings it: pip install -e '.[test]')")
    try:
        from mpi4py import MPI  # noqa: F401  (loads the MPI library)
    except (ImportError, RuntimeError) as e:
        pytest.skip(f"mpi4py cannot load an MPI library: {e}")
    return mpirun


def _mpirun(tmp_path, n_ranks: int, shape, seed: int, *flags: str, timeout: float = 180) -> dict:
    """Run transpose-sum under mpirun with ``n_ranks`` ranks; returns rank 0's report."""
    mpirun = _mpirun_or_skip()
    report_path = tmp_path / "report.json"
    # more ranks than the CI machine's 2 cores: Open MPI 4 reads the OMPI_ setting, 5 (PRRTE) the PRTE_ one
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"}
    args = [mpirun, "-n", str(n_ranks), sys.executable, "-m", "spillway", "mpi", "transpose-sum", "--verify",
            "--param", f"size={shape[0]}x{shape[1]}", "--param", f"seed={seed}", *flags,
            "--dashboard-address", "none", "--local-directory", str(tmp_path / "scratch"),
            "--report", str(report_path)]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"mpirun did not finish in {timeout}s:\n{output[-4000:]}")
    assert proc.returncode == 0, output[-4000:]
    report = json.loads(report_path.read_text())
    x = uniform_numpy(shape, seed=seed, dtype="float64").astype(np.float64)
    assert relative_error(np.float64(report["result"]["sum"]), (x + x.T).sum()) <= 1e-10
    assert report["verify"]["ok"] is True
    return report


@pytest.mark.slow
def test_mpirun_runs_a_workflow_on_worker_ranks(tmp_path):
    report = _mpirun(tmp_path, 3, (1000, 1000), 5, "--cpu", "--param", "chunks=250x250")
    # rank 0 is the scheduler; ranks 1 and 2 are the workers
    assert report["cluster"]["n_workers"] == 2 and report["cluster"]["kind"] == "cpu"


@pytest.mark.gpu
@pytest.mark.slow
def test_mpirun_gives_each_worker_rank_one_gpu(tmp_path, gpu_count):
    report = _mpirun(tmp_path, gpu_count + 1, (8000, 8000), 9, "--param", "chunks=2000x2000",
                     "--rmm-pool-size", "2GB", timeout=400)
    assert report["cluster"]["n_workers"] == gpu_count and report["cluster"]["kind"] == "gpu"
