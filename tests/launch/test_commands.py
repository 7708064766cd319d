"""The rendered flags are ones dask's own command lines accept, with the values meant:
each list is parsed by the real click command (``dask scheduler``, ``dask worker``,
``dask cuda worker``) without starting it."""

from __future__ import annotations

import pytest

from spillway.launch import commands
from spillway.options.settings import Options


def _parse(command, args: list[str]) -> dict:
    return command.make_context(command.name or "dask", list(args)).params


def test_scheduler_flags_parse_as_meant():
    from distributed.cli.dask_scheduler import main as scheduler

    options = Options.resolve(scheduler_port=8786, dashboard_address=":8790", interface="lo")
    params = _parse(scheduler, commands.scheduler_args(options, scheduler_file="/s.json", protocol="tcp",
                                                       multi_node=True))
    assert params["scheduler_file"] == "/s.json" and str(params["port"]) == "8786"
    assert params["interface"] == "lo" and params["dashboard_address"] == ":8790" and params["dashboard"]


def test_cpu_worker_flags_parse_as_meant():
    from distributed.cli.dask_worker import main as worker

    options = Options.resolve(cpu=True, threads_per_worker=2, memory_limit="3GB", local_directory="/scratch")
    params = _parse(worker, commands.cpu_worker_args(options, scheduler_file="/s.json", protocol="tcp",
                                                     n_workers=4))
    assert str(params["n_workers"]) == "4" and params["nthreads"] == 2
    assert params["memory_limit"] == "3000000000" and params["local_directory"] == "/scratch"
    assert params["death_timeout"] == str(commands.DEATH_TIMEOUT_S) and params["scheduler_file"] == "/s.json"


def _spec(options):
    """The spec of ``dask cuda worker``'s workers (dask-cuda's store), rendered away from their node."""
    from spillway.launch.spec import off_node_spec

    return off_node_spec(options.replace(memory_store="dask-cuda"), protocol="ucx", workers=4)


@pytest.mark.gpu
def test_gpu_worker_flags_parse_as_meant():
    from dask_cuda.cli import worker

    options = Options.resolve(rmm_pool_size="100GB", rmm_maximum_pool_size="120GB", device_memory_limit=0.7,
                              rmm_track_allocations=True, local_directory="/scratch")
    params = _parse(worker, commands.gpu_worker_args(_spec(options), scheduler_file="/s.json"))
    assert params["rmm_pool_size"] == "100000000000" and params["rmm_maximum_pool_size"] == "120000000000"
    assert params["device_memory_limit"] == "0.7" and params["rmm_track_allocations"] is True
    assert params["rmm_allocator_external_lib_list"] == ["cupy"] and params["enable_nvlink"] is True
    assert params["preload_argv"] == ()
    asynchronous = Options.resolve(rmm_async=True, rmm_release_threshold="10GB", nvlink=False)
    params = _parse(worker, commands.gpu_worker_args(_spec(asynchronous), scheduler_file="/s.json"))
    assert params["rmm_async"] is True and params["rmm_release_threshold"] == "10000000000"
    assert params["enable_nvlink"] is False


def test_auto_protocol():
    options = Options.resolve()
    assert commands.protocol(options, gpu=True, n_workers=8) == "ucx"
    assert commands.protocol(options, gpu=True, n_workers=1) == "tcp"
    assert commands.protocol(options, gpu=False, n_workers=8) == "tcp"
    assert commands.protocol(Options.resolve(protocol="tcp"), gpu=True, n_workers=8) == "tcp"


def test_spillway_worker_gets_a_flag_for_each_declared_worker_option():
    """The worker options are those declared ``worker=True``; each is rendered, unset ones
    as ``none`` and booleans as their switch, so the node's own config decides nothing."""
    from spillway.options.settings import OPTIONS

    declared = [o.key for o in OPTIONS if o.worker]
    assert [o.key for o in commands.WORKER_OPTIONS] == declared
    assert {"workers-per-gpu", "rmm-pool-size", "memory-store", "pinned-pool-size", "tls-key"} <= set(declared)
    # the scheduler's and the client's settings are not the workers'
    assert not {"host", "scheduler-port", "dashboard-address", "devices", "protocol"} & set(declared)

    args = commands.spillway_worker_args(Options.resolve(nvlink=False, rmm_track_allocations=True, memory_limit=0.4),
                                         scheduler_file="/s.json", protocol="ucx")
    assert args[:7] == ["worker", "--scheduler-file", "/s.json", "--protocol", "ucx", "--death-timeout",
                        str(commands.DEATH_TIMEOUT_S)]
    flags = args[7:]
    assert "--no-nvlink" in flags and "--rmm-track-allocations" in flags and "--no-rmm-async" in flags
    assert flags[flags.index("--memory-limit") + 1] == "0.4"
    assert flags[flags.index("--rmm-log-directory") + 1] == "none"
    named = [a[2:].removeprefix("no-") if a.startswith("--no-") else a[2:] for a in flags if a.startswith("--")]
    assert named == declared
