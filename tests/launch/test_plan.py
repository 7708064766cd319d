"""Launch planning against GPU inventories: a pure function, so machines are described here."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from spillway.options.errors import OptionsError
from spillway.launch import local_cpu
from spillway.options.gpus import Inventory
from spillway.launch.plan import plan
from spillway.options.settings import Options
from stand_ins import gpu_cluster_kwargs, h200_host, host_probe


inventory = functools.partial(h200_host, links=18)


def test_one_worker_per_gpu_with_ucx():
    p = plan(Options.resolve(), inventory(2), host=host_probe(have_ucxx=True, have_cuda_stack=True))
    assert (p.kind, p.devices, p.n_workers, p.protocol) == ("gpu", (0, 1), 2, "ucx")


def test_single_gpu_uses_tcp_without_note():
    p = plan(Options.resolve(), inventory(1), host=host_probe(have_ucxx=True, have_cuda_stack=True))
    assert p.protocol == "tcp" and not p.notes


def test_tcp_fallback_says_why():
    p = plan(Options.resolve(), inventory(2), host=host_probe(have_ucxx=False, have_cuda_stack=True))
    assert p.protocol == "tcp"
    assert any("distributed-ucxx is not installed" in n for n in p.notes)


def test_ucx_requested_without_ucxx_fails():
    with pytest.raises(OptionsError, match="protocol: ucx requested"):
        plan(Options.resolve(protocol="ucx"), inventory(2), host=host_probe(have_ucxx=False, have_cuda_stack=True))


def test_devices_by_index_and_uuid():
    inv = inventory(4)
    p = plan(Options.resolve(devices="2,GPU-00000000"), inv, host=host_probe(have_ucxx=True, have_cuda_stack=True))
    assert p.devices == (2, 0)


def test_unknown_device():
    with pytest.raises(OptionsError, match=r"devices: GPU 5 does not exist \(visible: 0, 1\)"):
        plan(Options.resolve(devices="0,5"), inventory(2), host=host_probe(have_ucxx=True, have_cuda_stack=True))


def test_more_workers_than_devices():
    with pytest.raises(OptionsError, match="n-workers: 3 workers need 3 GPUs but only 2 are selected"):
        plan(Options.resolve(n_workers=3), inventory(2), host=host_probe(have_ucxx=True, have_cuda_stack=True))


def test_fewer_workers_take_the_first_devices():
    p = plan(Options.resolve(n_workers=1, devices="1,0"), inventory(2),
             host=host_probe(have_ucxx=True, have_cuda_stack=True))
    assert p.devices == (1,) and p.n_workers == 1


def test_no_gpu_falls_back_to_cpu():
    p = plan(Options.resolve(), inventory(0), host=host_probe(have_ucxx=False, have_cuda_stack=False, cpu_count=8))
    assert p.kind == "cpu" and p.n_workers == 4 and p.protocol == "tcp"
    assert any("no GPU found" in n for n in p.notes)


def test_cpu_flag_wins_over_gpus():
    p = plan(Options.resolve(cpu=True, n_workers=3), inventory(2),
             host=host_probe(have_ucxx=True, have_cuda_stack=True))
    assert p.kind == "cpu" and p.n_workers == 3


def test_gpu_options_set_for_cpu_workers_are_said_to_be_left_aside():
    p = plan(Options.resolve(cpu=True, rmm_pool_size="20GB", nvlink=False), inventory(0),
             host=host_probe(have_ucxx=False, have_cuda_stack=False))
    assert ("rmm-pool-size=18.63 GiB, nvlink=False: only GPU workers use them; these are CPU workers, which leave "
            "them aside") in p.notes
    # left at their defaults, they are not mentioned
    assert not [n for n in plan(Options.resolve(cpu=True), inventory(0), host=host_probe()).notes if "GPU workers" in n]


def test_devices_without_gpus_fail():
    with pytest.raises(OptionsError, match="no GPU is visible"):
        plan(Options.resolve(devices="0"), inventory(0), host=host_probe(have_ucxx=False, have_cuda_stack=False))


def test_gpus_without_cuda_stack_run_on_cpu_with_note():
    p = plan(Options.resolve(), inventory(2), host=host_probe(have_ucxx=False, have_cuda_stack=False, cpu_count=2))
    assert p.kind == "cpu"
    assert any("dask-cuda/CuPy are not installed" in n for n in p.notes)


HOST = 270 * 10**9  # the 2 x H200 host's memory


def tiered(pinned: str) -> Options:
    return Options.resolve(memory_store="tiered", pinned_pool_size=pinned)


def test_pinned_pools_over_half_the_host_are_refused_with_both_numbers():
    # 80 GB x 2 workers is what the kernel's OOM killer ended on the 2 x H200 host
    with pytest.raises(OptionsError) as e:
        plan(tiered("80GB"), inventory(2), host=host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=HOST))
    message = str(e.value)
    assert "\n" not in message and message.startswith("pinned-pool-size: 80.0 GB per worker x 2 workers")
    assert "160.0 GB" in message and "135.0 GB limit" in message and "270.0 GB" in message


def test_pinned_pools_within_half_the_host_plan():
    p = plan(tiered("48GB"), inventory(2), host=host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=HOST))
    assert p.n_workers == 2
    # one worker may take what two may not
    plan(tiered("80GB").replace(n_workers=1), inventory(2),
         host=host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=HOST))


def test_pinned_pool_is_not_checked_where_it_is_not_taken():
    # dask-cuda's store and managed memory take no pinned pool
    for options in (Options.resolve(pinned_pool_size="200GB", memory_store="dask-cuda"),
                    tiered("200GB").replace(rmm_managed_memory=True, rmm_pool_size=None, nvlink=False)):
        plan(options, inventory(2), host=host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=HOST))


def test_attach_plans_nothing():
    p = plan(Options.resolve(scheduler_address="tcp://127.0.0.1:1"), inventory(0), host=host_probe())
    assert p.kind == "attach"


def test_gpu_cluster_keywords_follow_options():
    opts = Options.resolve(rmm_pool_size="20GB", rmm_maximum_pool_size="100GB", device_memory_limit="12GB",
                           memory_limit="64GB", threads_per_worker=2, local_directory="/scratch/x")
    p = plan(opts, inventory(2), host=host_probe(have_ucxx=True, have_cuda_stack=True))
    kw = gpu_cluster_kwargs(opts, p)
    assert kw["CUDA_VISIBLE_DEVICES"] == [0, 1] and kw["n_workers"] == 2
    assert kw["rmm_pool_size"] == 20_000_000_000 and kw["rmm_maximum_pool_size"] == 100_000_000_000
    assert kw["device_memory_limit"] == 12_000_000_000 and kw["memory_limit"] == 64_000_000_000
    assert kw["protocol"] == "ucx" and kw["enable_nvlink"] is True
    assert kw["rmm_allocator_external_lib_list"] == ["cupy"]
    assert kw["threads_per_worker"] == 2 and kw["local_directory"] == "/scratch/x"
    assert kw["host"] == "127.0.0.1"


def test_gpu_keywords_tcp_has_no_nvlink_flag():
    opts = Options.resolve(protocol="tcp", rmm_pool_size=None)
    kw = gpu_cluster_kwargs(opts, plan(opts, inventory(2), host=host_probe(have_ucxx=True, have_cuda_stack=True)))
    assert kw["protocol"] == "tcp" and "enable_nvlink" not in kw
    assert kw["rmm_pool_size"] is None and kw["rmm_allocator_external_lib_list"] is None


def test_gpu_keywords_default_pool():
    opts = Options.resolve()
    kw = gpu_cluster_kwargs(opts, plan(opts, inventory(2), host=host_probe(have_ucxx=True, have_cuda_stack=True)))
    assert kw["rmm_pool_size"] == 0.9 and kw["rmm_allocator_external_lib_list"] == ["cupy"]


def test_cpu_cluster_keywords():
    opts = Options.resolve(cpu=True, n_workers=2, memory_limit="2GB", interface="lo")
    kw = local_cpu.cluster_kwargs(opts, plan(opts, inventory(0),
                                             host=host_probe(have_ucxx=False, have_cuda_stack=False)))
    assert kw["n_workers"] == 2 and kw["memory_limit"] == 2_000_000_000
    assert kw["interface"] == "lo" and "host" not in kw


def test_each_worker_may_pin_its_share_of_half_the_host():
    p = plan(Options.resolve(), inventory(2), host=host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=HOST))
    assert p.host_memory == HOST and p.pinned_limit == HOST // 2 // 2
    from spillway.launch.spec import HostFacts

    # 48 GB pinned fits each worker's share of the 270 GB host (not this machine's memory)
    kwargs = gpu_cluster_kwargs(tiered("48GB"), p, HostFacts(host_memory_limit=HOST, host_total=HOST))
    assert kwargs["data"][1]["pinned_limit"] == p.pinned_limit


def test_a_pinned_pool_that_fills_the_memory_limit_is_refused_before_anything_starts():
    # B3 small asked for 20 GB pinned under a 20 GB limit: the worker sat over its limit
    # with nothing of the store's to write to disk, paused for good
    from spillway.launch.spec import HostFacts, worker_specs

    facts = HostFacts(host_memory_limit=HOST, host_total=HOST)

    node = plan(tiered("20GB").replace(memory_limit=20 * 10**9), inventory(1),
                host=host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=HOST))
    with pytest.raises(OptionsError) as e:
        worker_specs(tiered("20GB").replace(memory_limit=20 * 10**9), node, facts)
    message = str(e.value)
    assert "\n" not in message and message.startswith("pinned-pool-size: 20.0 GB per worker is over its memory-limit")
    assert "of 20.0 GB less 2.1 GB" in message and "at most 17.9 GB" in message
    # room for the process: taken
    (spec,) = worker_specs(tiered("17GB").replace(memory_limit=20 * 10**9), node, facts)
    assert spec.pinned_arena == 17 * 10**9


def test_a_gpu_another_process_holds_is_refused_with_its_numbers():
    # on the H100 host a cluster still closing held GPU 0: the next cluster's RMM pool
    # failed inside its worker and the start reported only "0 of 1 workers within 120 s"
    import dataclasses

    from spillway.options.gpus import Inventory

    host = host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=HOST)
    full = inventory(2)
    busy = Inventory((dataclasses.replace(full.gpus[0], memory_free=8 * 10**9), full.gpus[1]),
                     full.driver_version, full.cuda_driver_version, None)
    with pytest.raises(OptionsError) as e:
        plan(Options.resolve(), busy, host=host)
    message = str(e.value)
    assert "\n" not in message and message.startswith("GPU 0: 8.0 GB free of 141.0 GB (133.0 GB held by other processes)")
    assert "rmm-pool-size 'auto'" in message
    # the free GPU alone plans; so do allocators that take no pool up front
    assert plan(Options.resolve(devices="1"), busy, host=host).devices == (1,)
    assert plan(Options.resolve(rmm_pool_size=None), busy, host=host).n_workers == 2
    assert plan(Options.resolve(rmm_pool_size="4GB"), busy, host=host).n_workers == 2


def test_a_new_cluster_waits_briefly_for_a_gpu_being_given_back(monkeypatch):
    import dataclasses

    from spillway.launch import session as launch
    from spillway.options.errors import GpusBusy
    from spillway.options.gpus import Inventory

    full = inventory(1)
    busy = Inventory((dataclasses.replace(full.gpus[0], memory_free=8 * 10**9),), full.driver_version,
                     full.cuda_driver_version, None)
    readings = [busy, busy, full]
    monkeypatch.setattr(launch, "discover", lambda: readings.pop(0) if len(readings) > 1 else readings[0])
    monkeypatch.setattr(launch.time, "sleep", lambda s: None)
    host = host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=HOST)
    assert launch.plan_when_free(Options.resolve(), host).devices == (0,)
    # held past the wait: the one-line refusal
    monkeypatch.setattr(launch, "discover", lambda: busy)
    with pytest.raises(GpusBusy, match=r"^GPU 0: 8.0 GB free of 141.0 GB"):
        launch.plan_when_free(Options.resolve(), host, wait_s=0)


def test_uvloop_is_refused_before_start_where_it_is_not_installed_and_reaches_the_workers_config():
    from spillway.launch import worker_config

    with pytest.raises(OptionsError, match=r"^event-loop: uvloop requested but the uvloop package is not installed"):
        plan(Options(event_loop="uvloop"), Inventory(), host_probe(have_uvloop=False))
    assert plan(Options(event_loop="uvloop"), Inventory(), host_probe(have_uvloop=True)).kind == "cpu"
    config = worker_config(Options(event_loop="uvloop"), tiered_store=False)
    assert config["distributed.admin.event-loop"] == "uvloop"
    # auto leaves distributed's own default in place
    assert "distributed.admin.event-loop" not in worker_config(Options(), tiered_store=False)


def test_an_async_pool_between_gpus_over_nvlink_is_refused_in_one_line_before_anything_starts():
    ucx_host = host_probe(have_ucxx=True, have_cuda_stack=True)
    with pytest.raises(OptionsError) as e:
        plan(Options.resolve(rmm_async=True), inventory(2), host=ucx_host)
    (line,) = str(e.value).splitlines()
    assert line.startswith("rmm-async: the 2 GPU workers would move every chunk") and "0.2 GB/s" in line
    with pytest.raises(OptionsError, match="rmm-async: the 4 GPU workers"):
        plan(Options.resolve(rmm_async=True, workers_per_gpu=2), inventory(2), host=ucx_host)
    # refused before the GPUs are read for room: a busy GPU does not hide it
    busy = inventory(2)
    busy = dataclasses.replace(busy, gpus=tuple(dataclasses.replace(g, memory_free=10**9) for g in busy.gpus))
    with pytest.raises(OptionsError, match="rmm-async"):
        plan(Options.resolve(rmm_async=True), busy, host=ucx_host, gpus_free=True)
    # where no chunk crosses NVLink it plans: one worker, TCP, NVLink off
    assert plan(Options.resolve(rmm_async=True), inventory(1), host=ucx_host).n_workers == 1
    assert plan(Options.resolve(rmm_async=True, protocol="tcp"), inventory(2), host=ucx_host).protocol == "tcp"
    assert plan(Options.resolve(rmm_async=True, nvlink=False), inventory(2), host=ucx_host).protocol == "ucx"
