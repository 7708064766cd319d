"""A GPU worker's host tier leaves room for the process and the machine: with the default
memory limit (the whole machine shared out) a tier that size let the kernel kill a worker."""

from __future__ import annotations

import logging

from distributed.worker_memory import parse_memory_limit

from spillway.launch import spec
from spillway.launch.plan import plan
from spillway.memory.growth import headroom_for, host_total
from spillway.options.settings import Options
from stand_ins import gpu_cluster_kwargs, h200_host, host_probe

GiB = 2**30


def _tier(n_gpus: int, **options) -> tuple[int, int]:
    opts = Options.resolve(**options)
    p = plan(opts, h200_host(n_gpus), host=host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=host_total()))
    limit = parse_memory_limit(opts.memory_limit or None, 1, total_cores=p.n_workers,
                               logger=logging.getLogger("test"))
    return spec.worker_specs(opts, p)[0].host_limit, limit


def test_the_default_host_tier_leaves_the_process_and_the_machine_their_memory():
    for n in (1, 2):
        tier, limit = _tier(n)
        # distributed's auto limit shares the whole machine out
        assert limit * n >= 0.95 * host_total()
        reserve = headroom_for(host_total()) // n + spec.PROCESS_BYTES
        assert tier == max(limit - reserve, limit // 2)
        assert tier * n <= host_total() - headroom_for(host_total())
        # and the store the launcher builds gets that tier
        assert gpu_cluster_kwargs(Options.resolve(), plan(
            Options.resolve(), h200_host(n), host=host_probe(have_ucxx=True, have_cuda_stack=True,
                                                             host_memory=host_total())))["data"][1]["host_limit"] == _tier(n)[0]


def test_an_explicit_limit_is_a_bound_and_no_limit_stays_none():
    tier, limit = _tier(1, memory_limit="8GB")
    assert limit == 8 * 10**9 and limit // 2 <= tier < limit
    assert _tier(1, memory_limit=0)[0] in (None, 0)
