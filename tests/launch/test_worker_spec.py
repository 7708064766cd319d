"""Every setting of a GPU worker, from the CLI flag to every launcher: options parsed from
real `spillway worker` flags resolve into a WorkerSpec, and each backend's rendering
(LocalCUDACluster keywords, `spillway worker`'s CUDAWorker keywords, the Slurm script's
`spillway worker` and `dask cuda worker` command lines, MPI's execute keywords) is read
back field by field. A field of the spec that one backend drops fails here, a new field
included: it is either read back from each rendering or named below with the reason a
backend does not carry it."""

from __future__ import annotations

import dataclasses
import shlex

import pytest
from click.testing import CliRunner

from spillway.launch.mpi import execute_kwargs
from spillway.launch.slurm_batch import JobSettings, Run, job_script
from spillway.cli import main
from spillway import launch
from spillway.launch import gpu_worker, local_gpu
from spillway.launch.plan import plan
from spillway.launch.spec import HostFacts, WorkerSpec, off_node_spec, worker_specs
from spillway.launch.worker_store import build_store
from stand_ins import h200_host, host_probe, node_spec

HOST = 512 * 10**9
FACTS = HostFacts(host_memory_limit=HOST, host_total=HOST)
PLANNED = host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=HOST)
JOB = JobSettings(nodes=2, gpus_per_node=4, time="01:00:00", output_dir="/shared/runs")

#: worker flags, as a user types them; each set gives every field of the spec a value
#: other than its default where the combination allows it
FLAG_SETS = {
    "tiered-ucx": ["--device-memory-limit", "100GB", "--rmm-pool-size", "50GB", "--rmm-maximum-pool-size", "120GB",
                   "--pinned-pool-size", "8GB", "--threads-per-worker", "3", "--memory-limit", "64GB",
                   "--rmm-track-allocations", "--no-nvlink", "--protocol", "ucx", "--interface", "ib0"],
    "tiered-auto": ["--device-memory-limit", "0.7", "--threads-per-worker", "2", "--memory-limit", "auto",
                    "--pinned-pool-size", "auto", "--protocol", "ucx", "--workers-per-gpu", "2"],
    "dask-cuda-async": ["--memory-store", "dask-cuda", "--rmm-async", "--rmm-release-threshold", "10GB",
                        "--device-memory-limit", "90GB", "--threads-per-worker", "4", "--memory-limit", "0.5",
                        "--protocol", "tcp"],
    "dask-cuda-pool": ["--memory-store", "dask-cuda", "--rmm-pool-size", "0.6", "--device-memory-limit", "0",
                       "--memory-limit", "0", "--protocol", "ucx", "--nvlink", "--rmm-track-allocations"],
    # several workers on each GPU with dask-cuda's store: `spillway worker` in the batch script too
    "dask-cuda-shared": ["--memory-store", "dask-cuda", "--workers-per-gpu", "3", "--rmm-pool-size", "0.6",
                         "--device-memory-limit", "0.75", "--protocol", "ucx"],
    # managed memory has no device tier to manage: dask-cuda's store, whatever memory-store says
    "managed": ["--rmm-managed-memory", "--no-nvlink", "--protocol", "ucx", "--memory-store", "tiered",
                "--rmm-pool-size", "none"],
}


@pytest.fixture
def files(tmp_path):
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("x")
    (tmp_path / "rmm-logs").mkdir()
    return tmp_path


def flags_of(name: str, files) -> list[str]:
    extra = ["--local-directory", str(files / "scratch")]
    if name not in ("tiered-auto", "managed"):
        extra += ["--rmm-log-directory", str(files / "rmm-logs")]
    if name in ("tiered-ucx", "dask-cuda-async"):
        extra += ["--tls-ca-file", str(files / "ca.pem"), "--tls-cert", str(files / "cert.pem"),
                  "--tls-key", str(files / "key.pem")]
    return FLAG_SETS[name] + extra


def cli_options(args: list[str], monkeypatch):
    """The options `spillway worker` builds from ``args`` (its own parsing, nothing started)."""
    seen = {}
    monkeypatch.setattr(launch, "run_node", lambda options, **kw: seen.update(options=options))
    result = CliRunner().invoke(main, ["worker", *args])
    assert result.exit_code == 0, result.output
    return seen["options"]


# --- each backend's rendering, read back into spec fields


def _from_dask_cuda(kw: dict, threads: int) -> dict:
    out = {key: kw[key] for key in ("protocol", "device_memory_limit", "memory_limit", "local_directory",
                                    "rmm_maximum_pool_size", "rmm_managed_memory", "rmm_async",
                                    "rmm_release_threshold", "rmm_log_directory", "rmm_track_allocations")}
    out.update(threads=threads, pool_size=kw["rmm_pool_size"])
    assert kw["rmm_allocator_external_lib_list"] == (["cupy"] if out["pool_size"] is not None
                                                     or out["rmm_async"] or out["rmm_managed_memory"] else None)
    if "enable_nvlink" in kw:
        out["nvlink"] = kw["enable_nvlink"]
    out["memory_store"] = "tiered" if "data" in kw else "dask-cuda"
    if "data" in kw:
        func, store = kw["data"]
        assert func is build_store and store["protocol"] == out["protocol"]
        assert store["device_memory_limit"] == out["device_memory_limit"]
        out.update(host_limit=store["host_limit"], pinned_arena=store["pinned_pool_size"],
                   pinned_limit=store["pinned_limit"])
    return out


def _tls(security) -> dict:
    if security is None:
        return dict(tls_ca_file=None, tls_cert=None, tls_key=None)
    return dict(tls_ca_file=security.tls_ca_file, tls_cert=security.tls_worker_cert,
                tls_key=security.tls_worker_key)


def local_cluster(options, specs) -> dict:
    kw = local_gpu.specs_kwargs(options, specs)
    out = _from_dask_cuda(kw, kw["threads_per_worker"])
    devices = kw.get("worker_devices", kw["CUDA_VISIBLE_DEVICES"])
    assert kw["CUDA_VISIBLE_DEVICES"] == list(dict.fromkeys(devices)) and kw["n_workers"] == len(devices)
    out.update(interface=kw["interface"], devices=tuple(devices), workers_per_gpu=devices.count(devices[0]),
               **_tls(kw["security"]))
    return out


def cuda_worker(options, spec) -> dict:
    kw = gpu_worker.worker_kwargs(options, spec)
    return dict(_from_dask_cuda(kw, kw["nthreads"]), interface=kw["interface"],
                workers_per_gpu=kw["workers_per_gpu"], **_tls(kw["security"]))


def mpi_rank(options, spec) -> dict:
    kw = execute_kwargs(options, n_workers=8, spec=spec)
    worker = dict(kw["worker_options"], **{k: kw[k] for k in ("protocol", "memory_limit", "local_directory")})
    return dict(_from_dask_cuda(worker, kw["nthreads"]), interface=kw["interface"])


def _value(text: str):
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def dask_cuda_worker(argv: list[str]) -> dict:
    """The fields `dask cuda worker`'s flags set, read as dask-cuda reads them."""
    flags, switches, i = {}, set(), 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            flags[argv[i]] = argv[i + 1]
            i += 2
        else:
            switches.add(argv[i])
            i += 1
    limit = lambda key: _value(flags[key]) or None  # noqa: E731  (0: no limit)
    # the command starts one worker per visible GPU
    out = dict(protocol=flags["--protocol"], threads=int(flags["--nthreads"]), workers_per_gpu=1,
               device_memory_limit=limit("--device-memory-limit"), memory_limit=limit("--memory-limit"),
               memory_store="dask-cuda", interface=flags.get("--interface"),
               local_directory=flags.get("--local-directory"), rmm_log_directory=flags.get("--rmm-log-directory"),
               rmm_managed_memory="--rmm-managed-memory" in switches, rmm_async="--rmm-async" in switches,
               rmm_track_allocations="--rmm-track-allocations" in switches,
               tls_ca_file=flags.get("--tls-ca-file"), tls_cert=flags.get("--tls-cert"), tls_key=flags.get("--tls-key"))
    for key in ("rmm_pool_size", "rmm_maximum_pool_size", "rmm_release_threshold"):
        flag = "--" + key.replace("_", "-")
        out[key] = _value(flags[flag]) if flag in flags else None
    out["pool_size"] = out.pop("rmm_pool_size")
    if out["protocol"] == "ucx":
        out["nvlink"] = "--enable-nvlink" in switches
        assert out["nvlink"] != ("--disable-nvlink" in switches)
    uses_rmm = out["pool_size"] is not None or out["rmm_async"] or out["rmm_managed_memory"]
    assert (flags.get("--set-rmm-allocator-for-libs") == "cupy") == bool(uses_rmm)
    return out


def script_worker_argv(text: str, command: str) -> list[str]:
    line = next(line for line in text.replace("\\\n", " ").splitlines() if f"-m {command}" in line)
    words = shlex.split(line)
    words = words[words.index(command.split()[-1]) + 1:]
    return words[:next(i for i, w in enumerate(words) if w.startswith(">"))]


# --- what each backend may leave out, and why


def not_carried(backend: str, spec: WorkerSpec) -> dict[str, str]:
    out = {"device": "one set of keywords for all of a host's workers; each takes a visible GPU"}
    if backend == "local":
        out = {"device": "read back as the devices of all the workers"}
    if spec.protocol != "ucx":
        out["nvlink"] = "NVLink is a UCX transport"
    if not spec.tiered:
        for key in ("host_limit", "pinned_arena", "pinned_limit"):
            out[key] = "the tiered store's, and the workers have dask-cuda's"
    if backend == "mpi":
        out["workers_per_gpu"] = ("each rank starts one worker on the one GPU it is given; "
                                  "device_for_rank gives workers-per-gpu neighbouring ranks one GPU")
        for key in ("tls_ca_file", "tls_cert", "tls_key"):
            out[key] = "dask-mpi starts its scheduler without TLS; spillway mpi refuses the TLS options"
    return out


def assert_carries(backend: str, spec: WorkerSpec, read: dict) -> None:
    exempt = not_carried(backend, spec)
    for field in dataclasses.fields(WorkerSpec):
        if field.name in exempt:
            continue
        assert field.name in read, f"{backend} drops {field.name}"
        assert read[field.name] == getattr(spec, field.name), (backend, field.name)


# --- the walk


@pytest.mark.parametrize("name", sorted(FLAG_SETS))
def test_every_worker_setting_reaches_every_backend(name, files, monkeypatch):
    flags = flags_of(name, files)
    options = cli_options(["--scheduler-file", str(files / "s.json"), *flags], monkeypatch)
    inventory = h200_host(4)

    # the local cluster of this host
    local = options.replace(scheduler_file=None)
    specs = worker_specs(local, plan(local, inventory, host=PLANNED), FACTS)
    per_gpu = options.workers_per_gpu
    devices = tuple(d for d in (0, 1, 2, 3) for _ in range(per_gpu))
    assert len(specs) == 4 * per_gpu and tuple(s.device for s in specs) == devices
    read = local_cluster(local, specs)
    assert read.pop("devices") == devices
    assert_carries("local", specs[0], read)

    # `spillway worker` on a node (one CUDAWorker for the node's GPUs)
    node = node_spec(options, inventory, facts=FACTS, host=PLANNED)
    assert node == dataclasses.replace(specs[0], device=None)
    assert_carries("spillway worker", node, cuda_worker(options, node))

    # an MPI worker rank: its spec is its node's, one of 4 x workers-per-gpu ranks there
    rank = node_spec(options, inventory, workers=4 * per_gpu, facts=FACTS, host=PLANNED)
    assert rank == node
    assert_carries("mpi", rank, mpi_rank(local, rank))

    # the Slurm script: the tiered store's workers get the options as `spillway worker`
    # flags and resolve the spec on the node; dask-cuda's get `dask cuda worker` flags
    # from the spec known on the submit host
    text = job_script(local.replace(protocol=options.protocol), JOB, [Run("transpose-sum")])
    if node.tiered or per_gpu > 1:
        argv = script_worker_argv(text, "spillway worker")
        argv = [str(files / "s.json") if a == "$SCHEDULER_FILE" else a for a in argv]
        on_node = cli_options(argv, monkeypatch)
        assert node_spec(on_node, inventory, facts=FACTS, host=PLANNED) == node
        assert "dask cuda worker" not in text
    else:
        submitted = off_node_spec(local, protocol=options.protocol, workers=JOB.gpus_per_node)
        assert_carries("dask cuda worker", submitted, dask_cuda_worker(script_worker_argv(text, "dask cuda worker")))
        # what the node's dask-cuda makes of it is what the node's own spec says
        for key in ("device_memory_limit", "memory_limit", "pool_size"):
            value = getattr(submitted, key)
            total = {"device_memory_limit": 141 * 10**9, "memory_limit": HOST, "pool_size": None}[key]
            if isinstance(value, float) and total:
                assert int(value * total) == getattr(node, key), key
            else:
                assert value == getattr(node, key), key


def test_the_cli_flags_arrive_as_given(files, monkeypatch):
    """The flags the walk starts from, in the spec: bytes for the limits and the arena."""
    options = cli_options(["--scheduler-file", "/s.json", *flags_of("tiered-ucx", files)], monkeypatch)
    spec = node_spec(options, h200_host(2), facts=FACTS, host=PLANNED)
    assert (spec.device_memory_limit, spec.pool_size, spec.pinned_arena) == (100 * 10**9, 50 * 10**9, 8 * 10**9)
    assert (spec.threads, spec.local_directory, spec.memory_limit) == (3, str(files / "scratch"), 64 * 10**9)
    options = cli_options(["--scheduler-file", "/s.json", *flags_of("dask-cuda-async", files)], monkeypatch)
    spec = node_spec(options, h200_host(2), facts=FACTS, host=PLANNED)
    assert spec.rmm_async and spec.pool_size is None and spec.rmm_release_threshold == 10 * 10**9
    assert spec.memory_limit == HOST // 2 and not spec.tiered


@pytest.mark.parametrize("value, device, expected", [
    ("default", 100, 80), ("auto", 100, 100), (0.5, 100, 50), (0, 100, None), (7, 100, 7),
    ("default", None, 0.8), (0.5, None, 0.5), (0, None, None),
])
def test_the_device_limit_is_read_once_with_none_for_no_limit(value, device, expected):
    from spillway.launch.spec import device_limit

    assert device_limit(value, device) == expected


def test_auto_protocol_is_one_decision():
    from spillway.launch import commands
    from spillway.launch.protocol import choose_protocol
    from spillway.options.settings import Options

    for requested in ("auto", "tcp", "ucx"):
        for gpu in (True, False):
            for n in (1, 4):
                options = Options.resolve(protocol=requested)
                local = plan(options if gpu else options.replace(cpu=True), h200_host(n), host=PLANNED)
                assert local.protocol == choose_protocol(requested, gpu=gpu, n_workers=n, have_ucxx=True)[0]
                assert commands.protocol(options, gpu=gpu, n_workers=n) == local.protocol


@pytest.mark.parametrize("per_gpu", [1, 2, 4])
def test_workers_of_one_gpu_share_it(per_gpu):
    """Each worker's device limit and RMM pool are its share of its GPU, its host tier,
    memory limit and pinned arena its share of the host: the workers of a GPU (and of the
    host) together hold what one worker of it would."""
    from spillway.options.settings import Options

    options = Options.resolve(workers_per_gpu=per_gpu, protocol="ucx")
    launch = plan(options, h200_host(2), host=PLANNED)
    assert launch.n_workers == 2 * per_gpu and launch.gpus == (0, 1)
    assert launch.devices == tuple(d for d in (0, 1) for _ in range(per_gpu))
    gpu = h200_host(2).gpus[0].memory_total
    assert sum(launch.device_memory) == 2 * (gpu // per_gpu) * per_gpu
    specs = worker_specs(options, launch, FACTS)
    one = worker_specs(options.replace(workers_per_gpu=1), plan(options.replace(workers_per_gpu=1), h200_host(2),
                                                                host=PLANNED), FACTS)[0]
    for spec in specs:
        assert spec.workers_per_gpu == per_gpu
        assert abs(spec.device_memory_limit * per_gpu - one.device_memory_limit) <= per_gpu
        assert spec.pool_size == pytest.approx(one.pool_size / per_gpu)
        # the auto pool never grows past its start: the rest of the GPU is CUDA's
        assert spec.rmm_maximum_pool_size == pytest.approx(spec.pool_size)
        assert spec.memory_limit * per_gpu == pytest.approx(one.memory_limit, abs=per_gpu)
        assert spec.pinned_arena * per_gpu <= one.pinned_arena + per_gpu
    # away from the node the shares stay fractions of the GPU, as dask-cuda reads them
    off = off_node_spec(options, protocol="ucx", workers=4 * per_gpu)
    assert off.device_memory_limit == pytest.approx(0.8 / per_gpu)
    assert off.pool_size == pytest.approx(0.9 / per_gpu)
