"""Closing a cluster spillway started: a worker slow to exit after its work is killed,
and the close goes on with a warning; other failures still raise."""

from __future__ import annotations

import logging

import pytest
from distributed import WorkerPlugin

from spillway.launch import close_cluster


class Cluster:
    def __init__(self, error: BaseException | None = None):
        self.error, self.closed = error, 0

    def close(self):
        self.closed += 1
        if self.error is not None:
            raise self.error


def test_a_worker_outliving_the_close_timeout_is_a_warning(caplog):
    cluster = Cluster(TimeoutError())
    with caplog.at_level(logging.WARNING, logger="spillway"):
        close_cluster(cluster)
    assert cluster.closed == 1
    assert "did not exit within the close timeout and was killed" in caplog.text


def test_a_clean_close_logs_nothing(caplog):
    cluster = Cluster()
    with caplog.at_level(logging.WARNING, logger="spillway"):
        close_cluster(cluster)
    assert cluster.closed == 1 and caplog.text == ""


def test_other_close_failures_still_raise():
    with pytest.raises(OSError, match="scheduler gone"):
        close_cluster(Cluster(OSError("scheduler gone")))


class SlowExit(WorkerPlugin):
    """A worker plugin whose teardown takes ``seconds``, as handing back a large RMM pool
    and pinned arena does on a GPU worker."""

    name = "slow-exit"

    def __init__(self, seconds: float):
        self.seconds = seconds

    def teardown(self, worker):
        import time

        time.sleep(self.seconds)


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _run_and_close(close_timeout) -> list[str]:
    """Start a one-worker CPU cluster as `spillway run` does, compute on it, give its
    worker a 6 s exit and close it; the nanny's log lines."""
    import dask.array as da

    from spillway import launch
    from spillway.launch import session as session_module
    from spillway.options.settings import Options

    nanny = logging.getLogger("distributed.nanny")
    lines, level = Lines(), nanny.level
    nanny.addHandler(lines)
    nanny.setLevel(logging.INFO)
    # open_cluster reads the close timeout from its own module's name
    original = session_module.close_timeout_s
    try:
        if close_timeout is not None:
            session_module.close_timeout_s = lambda *a, **k: close_timeout
        options = Options.resolve(cpu=True, n_workers=1, dashboard_address="")
        with launch.open_cluster(options) as session:
            assert float(session.client.compute(da.ones((100, 100), chunks=50).sum()).result()) == 10_000
            session.client.register_plugin(SlowExit(6.0))
    finally:
        session_module.close_timeout_s = original
        nanny.removeHandler(lines)
        nanny.setLevel(level)
    return lines.lines


@pytest.mark.timeout(120)
def test_closing_after_a_run_waits_for_a_slow_worker_instead_of_killing_it():
    lines = _run_and_close(None)  # spillway's close timeout for CPU workers
    assert not [line for line in lines if "still alive" in line], lines
    # distributed's own 5 s would have killed the same worker (said as the nanny's timeout
    # ends, or, on a loaded machine, only as the kill's signal)
    lines = _run_and_close(5)
    assert any("still alive after" in line or "was killed by signal 9" in line for line in lines), lines


def test_close_timeout_grows_with_what_a_gpu_worker_holds():
    from spillway.launch.closing import CLOSE_BASE_S, CLOSE_BYTES_PER_S, close_timeout_s
    from spillway.launch.plan import LaunchPlan
    from spillway.launch.spec import HostFacts, worker_specs
    from spillway.options.settings import Options

    assert close_timeout_s(None) == CLOSE_BASE_S  # a CPU worker
    gpu = LaunchPlan(kind="gpu", devices=(0, 1), n_workers=2, protocol="ucx", host_memory=4 * 10**11)

    def spec(**options):
        # on the GPU host's memory, not this machine's (48 GB pinned must fit its memory-limit)
        return worker_specs(Options.resolve(**options), gpu, HostFacts(host_memory_limit=4 * 10**11,
                                                                       host_total=4 * 10**11))[0]

    # the B3 worker of the GPU host: a 126 GB pool, 48 GB pinned (under its 100 GB bound)
    b3 = close_timeout_s(spec(rmm_pool_size="126GB", pinned_pool_size="48GB"), 141 * 10**9)
    assert b3 == CLOSE_BASE_S + (126 + 100) * 10**9 / CLOSE_BYTES_PER_S
    # the default pool is 90% of the GPU
    default = close_timeout_s(spec(), 141 * 10**9)
    assert default == pytest.approx(CLOSE_BASE_S + (0.9 * 141 + 100) * 10**9 / CLOSE_BYTES_PER_S)
    # dask-cuda's store pins nothing of spillway's
    assert close_timeout_s(spec(memory_store="dask-cuda", rmm_pool_size="10GB")) == \
        CLOSE_BASE_S + 10 * 10**9 / CLOSE_BYTES_PER_S
