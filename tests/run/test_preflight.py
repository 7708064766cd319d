"""`spillway run` refuses what no GPU worker's tiers could hold before the cluster starts,
with the same numbers the running cluster would give."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types

import pytest
from click.testing import CliRunner
from stand_ins import h200_host, host_probe

from spillway.run import preflight
from spillway.cli import main
from spillway.options.errors import AdmissionError
from spillway.launch.spec import HostFacts, worker_specs
from spillway.options.settings import Options

# the module, not the function the package exports under its name
plan_module = importlib.import_module("spillway.launch.plan")

GB = 10**9
HOST = 128 * 2**30


@pytest.fixture
def one_h200(monkeypatch):
    """This machine seen as one H200 with the CUDA stack, 128 GiB of memory; nothing may start."""
    import spillway.options.gpus as gpus
    import spillway.launch.session as launch

    monkeypatch.setattr(gpus, "discover", lambda: h200_host(1))
    probe = host_probe(have_ucxx=False, have_cuda_stack=True, host_memory=HOST)
    monkeypatch.setattr(plan_module.HostProbe, "here", classmethod(lambda cls: probe))
    monkeypatch.setattr(HostFacts, "here", classmethod(lambda cls: HostFacts(HOST, HOST)))

    def no_cluster(*a, **k):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(launch, "start_cluster", no_cluster)


def test_planned_capacity_is_what_the_specs_hold(tmp_path):
    options = Options.resolve(device_memory_limit="100GB", local_directory=str(tmp_path))
    launch = plan_module.plan(options, h200_host(2), host_probe(have_ucxx=False, have_cuda_stack=True,
                                                                  host_memory=HOST))
    specs = worker_specs(options, launch, HostFacts(HOST, HOST))
    target, capacity = preflight.planned(specs, launch.device_memory, str(tmp_path), HOST)
    assert capacity.device_bytes == 200 * GB and target.worker_bytes == 100 * GB and target.n_workers == 2
    assert capacity.host_bytes == sum(s.host_limit for s in specs) > 0
    assert 0 < capacity.disk_bytes < capacity.disk_free_bytes


def test_no_device_limit_counts_the_whole_gpu(tmp_path):
    options = Options.resolve(device_memory_limit=0, local_directory=str(tmp_path))
    launch = plan_module.plan(options, h200_host(1), host_probe(have_ucxx=False, have_cuda_stack=True,
                                                                  host_memory=HOST))
    specs = worker_specs(options, launch, HostFacts(HOST, HOST))
    target, capacity = preflight.planned(specs, launch.device_memory, None, HOST)
    assert capacity.device_bytes == 141 * GB == target.worker_bytes


def test_a_run_past_every_tier_is_refused_before_the_cluster_starts(one_h200, tmp_path, no_cluster):
    result = CliRunner().invoke(main, ["run", "svd", "--param", "size=190000000x500",
                                       "--local-directory", str(tmp_path)])
    assert result.exit_code == 3, result.output
    line = result.output.strip().splitlines()[-1]
    assert "svd: projected footprint" in line and "exceeds the cluster's device + host + disk capacity" in line


def test_a_run_past_every_tier_is_refused_while_another_process_holds_the_gpu(one_h200, monkeypatch, tmp_path):
    # on the H200 host a cluster closing before this run held 49.9 GB of GPU 0: the run was
    # told to free the GPU, not that it could never fit
    import spillway.options.gpus as gpus

    held = h200_host(1)
    held = dataclasses.replace(held, gpus=(dataclasses.replace(held.gpus[0], memory_free=90 * GB),))
    monkeypatch.setattr(gpus, "discover", lambda: held)
    result = CliRunner().invoke(main, ["run", "svd", "--param", "size=190000000x500",
                                       "--local-directory", str(tmp_path)])
    assert result.exit_code == 3, result.output
    assert "exceeds the cluster's device + host + disk capacity" in result.output.strip().splitlines()[-1]


def test_a_run_that_fits_is_not_refused(one_h200, tmp_path):
    options = Options.resolve(local_directory=str(tmp_path))
    preflight.refuse_before_start(options, "svd", {"size": "1000000x500"})  # 4 GB: nothing raised
    with pytest.raises(AdmissionError, match="projected footprint"):
        preflight.refuse_before_start(options, "svd", {"size": "190000000x500"})


def test_cpu_and_attached_clusters_are_left_to_the_running_check():
    # 76 GB, past this machine: the CPU workers' capacity is read once they run
    preflight.refuse_before_start(Options.resolve(cpu=True), "svd", {"size": "19000000x500"})
    preflight.refuse_before_start(Options.resolve(scheduler_address="tcp://127.0.0.1:1"), "svd",
                                  {"size": "190000000x500"})


class _Untouchable(types.ModuleType):
    """A ``cupy`` whose every function fails: planning may not make a CuPy array or call
    into CUDA (its array type may be named, as dask's chunk-type registry names it)."""

    ndarray = type("ndarray", (), {})

    def __getattr__(self, name):
        raise AssertionError(f"cupy.{name} used while sizing a run before the cluster starts")


# inputs under the capacity (so the graph is built) whose projected footprints are over it
@pytest.mark.parametrize("workflow, size", [("svd", "62000000x500"), ("tsqr", "47500000x500"),
                                            ("matmul", "150GB"), ("fft", "200GB"), ("stencil", "250GB")])
def test_sizing_a_gpu_run_touches_no_cupy(one_h200, tmp_path, monkeypatch, workflow, size):
    # dask's tsqr runs its QR on the metas: on CuPy metas that is cuSOLVER and a CUDA context
    # on GPU 0 for a graph that is never computed
    import dask.array  # noqa: F401  (imported as it is on a GPU host, with its chunk types, first)

    monkeypatch.setitem(sys.modules, "cupy", _Untouchable("cupy"))
    options = Options.resolve(local_directory=str(tmp_path))
    with pytest.raises(AdmissionError, match="exceeds the cluster's"):
        preflight.refuse_before_start(options, workflow, {"size": size})


def _graph_shape(built):
    results = built.result if isinstance(built.result, tuple) else (built.result,)
    return built.footprint, [r.chunks for r in results], sum(len(r.__dask_graph__()) for r in results)


@pytest.mark.parametrize("name, size", [("svd", "20000000x500"), ("matmul", "200GB"), ("rechunk", "150GB"),
                                        ("stencil", "150GB")])
def test_the_sized_graph_has_the_gpu_runs_footprint_chunks_and_tasks(name, size):
    from spillway import workflows
    from spillway.workflows.params import Target

    gpu = Target(kind="gpu", n_workers=1, worker_bytes=100 * GB)
    _, sized = workflows.get(name).build_run({"size": size}, dataclasses.replace(gpu, chunk_backend="numpy"))
    _, as_run = workflows.get(name).build_run({"size": size}, gpu)
    assert _graph_shape(sized) == _graph_shape(as_run)
    results = sized.result if isinstance(sized.result, tuple) else (sized.result,)
    assert all(type(r._meta).__module__.startswith("numpy") for r in results)


def test_the_service_sizes_a_submission_on_a_gpu_cluster_without_cupy(monkeypatch):
    """The HTTP service's process sizes each submission (its footprint, refused past the
    cluster) without a CUDA context of its own."""
    import dask.array  # noqa: F401

    from spillway.service.jobs.queue import JobQueue
    from spillway.memory.admission import Capacity
    from spillway.workflows.params import Target

    queue = object.__new__(JobQueue)  # the sizing alone: no database, no cluster
    queue.target = lambda: Target(kind="gpu", n_workers=1, worker_bytes=100 * GB)
    queue.tiers = lambda: Capacity(device_bytes=100 * GB, host_bytes=100 * GB, disk_bytes=50 * GB, n_workers=1)
    queue.input_roots = ()
    monkeypatch.setitem(sys.modules, "cupy", _Untouchable("cupy"))
    assert queue.footprint("svd", {"size": "20000000x500"}) > 80 * GB
    with pytest.raises(AdmissionError, match="exceeds the cluster's"):
        queue.footprint("svd", {"size": "52000000x500"})


_FRESH_REFUSAL = '''
import importlib, sys
sys.path[:0] = [sys.argv[3]]
from stand_ins import h200_host, host_probe
import spillway.options.gpus as gpus
import spillway.launch.session as launch
from spillway.launch.spec import HostFacts
plan = importlib.import_module("spillway.launch.plan")
HOST = 128 * 2**30
gpus.discover = lambda: h200_host(1)
probe = host_probe(have_ucxx=False, have_cuda_stack=True, host_memory=HOST)
plan.HostProbe.here = classmethod(lambda cls: probe)
HostFacts.here = classmethod(lambda cls: HostFacts(HOST, HOST))
def no_cluster(*a, **k):
    raise AssertionError("a cluster was started")
launch.start_cluster = no_cluster
from click.testing import CliRunner
from spillway.cli import main
result = CliRunner().invoke(main, ["run", sys.argv[2], "--param", "size=68000000x500", "--local-directory", sys.argv[1]])
print(result.exit_code)
print(result.output.strip().splitlines()[-1])
print("dask.array" in sys.modules)
print("distributed" in sys.modules)
'''


@pytest.mark.parametrize("workflow", ["svd", "tsqr"])
def test_a_fresh_process_refuses_the_svd_by_its_footprint_without_importing_dask_array(tmp_path, workflow):
    """The input (253 GiB) is under the planned capacity, so the refusal is the projected
    footprint's; the parameters say it, no graph is built, and neither dask.array (which
    imports CuPy on a GPU host) nor distributed is imported."""
    import subprocess
    from pathlib import Path

    helpers = Path(__file__).resolve().parents[1] / "helpers"
    done = subprocess.run([sys.executable, "-c", _FRESH_REFUSAL, str(tmp_path), workflow, str(helpers)],
                          capture_output=True, text=True, timeout=120)
    code, line, imported, distributed = done.stdout.strip().splitlines()[-4:]
    assert code == "3", done.stdout + done.stderr
    assert f"{workflow}: projected footprint" in line and "exceeds the cluster's" in line
    assert imported == "False"
    # nor distributed: its import was 0.9-1.0 s of a 1.5 s refusal on the GPU hosts
    assert distributed == "False"


def test_this_hosts_facts_are_distributeds_reading_without_importing_distributed():
    """The refusal before start reads the host's memory limit as distributed does (its
    workers' limits are shared out of it), without the package's import: on the GPU hosts
    HostFacts.here() imported distributed, 0.7 s of the refusal the test above stubs out."""
    import subprocess

    code = ("import sys\nfrom spillway.launch.spec import HostFacts\n"
            "facts = HostFacts.here()\nprint('distributed' in sys.modules)\n"
            "from distributed.system import MEMORY_LIMIT\nprint(facts.host_memory_limit == MEMORY_LIMIT)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "True"], done.stdout + done.stderr
