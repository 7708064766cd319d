"""pinned-pool-size: `auto` by default, resolved per worker against the launch plan."""

from __future__ import annotations

import pytest

from spillway.options.errors import OptionsError
from spillway.launch import spec
from spillway.launch.plan import PINNED_HOST_FRACTION, plan
from spillway.options.settings import Options
from stand_ins import gpu_cluster_kwargs, h200_host, host_probe

HOST = 270 * 10**9  # a stand-in for the 2 x H200 host's memory


inventory = h200_host


def arena_of(options: Options, host_tier: int | None, n_gpus: int = 2, host_memory: int = HOST) -> int:
    """The arena size a worker is started with, as the local GPU launcher passes it, for a
    worker whose host tier holds ``host_tier`` bytes (distributed caps memory-limit at the
    memory of the machine running the test, so the tier is a stand-in too)."""
    p = plan(options, inventory(n_gpus), host=host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=host_memory))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(spec, "host_limit", lambda memory_limit, facts, n_workers: host_tier)
        facts = spec.HostFacts(host_memory_limit=host_memory, host_total=host_memory)
        kwargs = gpu_cluster_kwargs(options, p, facts)["data"][1]
    assert kwargs["host_limit"] == host_tier
    return kwargs["pinned_pool_size"]


@pytest.mark.parametrize("raw, parsed", [
    (None, "auto"), ("auto", "auto"), ("AUTO", "auto"), ("0", 0), (0, 0), ("48GB", 48 * 10**9),
])
def test_pinned_pool_size_parses(raw, parsed):
    opts = Options.resolve() if raw is None else Options.resolve(pinned_pool_size=raw)
    assert opts.pinned_pool_size == parsed


@pytest.mark.parametrize("raw, fragment", [
    ("0.5", "pinned-pool-size: 0.5 must be bytes (such as 32GB), not a fraction"),
    ("lots", "pinned-pool-size: cannot parse 'lots'"),
])
def test_bad_pinned_pool_sizes_fail_with_one_line(raw, fragment):
    with pytest.raises(OptionsError) as e:
        Options.resolve(pinned_pool_size=raw)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_auto_is_the_workers_share_of_half_the_host():
    # a host tier larger than the share: the share bounds the arena
    opts = Options.resolve()
    assert arena_of(opts, 135 * 10**9) == int(PINNED_HOST_FRACTION * HOST) // 2 == 67_500_000_000
    assert arena_of(opts.replace(n_workers=1), 270 * 10**9) == 135_000_000_000
    assert arena_of(opts, 32 * 10**9, host_memory=64 * 10**9) == 16 * 10**9


def test_auto_is_at_most_the_host_tier():
    # pinning more than the host tier can hold would never be used
    assert arena_of(Options.resolve(), 20 * 10**9) == 20 * 10**9
    # no host-tier limit (memory-limit 0): the share alone
    assert arena_of(Options.resolve(memory_limit=0), None) == 67_500_000_000


def test_explicit_sizes_and_zero_pass_through():
    assert arena_of(Options.resolve(pinned_pool_size="48GB"), 135 * 10**9) == 48 * 10**9
    assert arena_of(Options.resolve(pinned_pool_size=0), 135 * 10**9) == 0


def test_auto_is_never_refused_by_the_plan():
    # on a small host with many workers auto shrinks to fit; an explicit size is refused
    small = 16 * 10**9
    p = plan(Options.resolve(), inventory(8), host=host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=small))
    assert spec.pinned_arena(Options.resolve().pinned_pool_size, p.pinned_limit, 10**12) == small // 2 // 8
    with pytest.raises(OptionsError, match="pinned-pool-size: 2.0 GB per worker x 8 workers"):
        plan(Options.resolve(pinned_pool_size="2GB"), inventory(8),
             host=host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=small))


def test_auto_without_any_bound_takes_no_arena():
    p = plan(Options.resolve(), inventory(2), host=host_probe(have_ucxx=True, have_cuda_stack=True, host_memory=0))
    assert p.pinned_limit is None and spec.pinned_arena(Options.resolve().pinned_pool_size, p.pinned_limit, None) == 0
