"""A new cluster says where its start went: each step's seconds on the session and in one
log line."""

import logging
import time

from spillway.launch import open_cluster
from spillway.options.settings import Options


def test_a_cpu_cluster_times_each_step_of_its_start(caplog):
    caplog.set_level(logging.INFO, logger="spillway")
    began = time.perf_counter()
    with open_cluster(Options.resolve(cpu=True, n_workers=1, dashboard_address="")) as session:
        wall = time.perf_counter() - began
        steps = session.start_steps
        assert list(steps) == ["plan", "start", "client", "workers", "plugins", "data plane", "settle"], steps
        assert all(v >= 0 for v in steps.values()) and sum(steps.values()) <= wall
        assert session.client.submit(sum, [1, 2]).result(timeout=30) == 3
    (line,) = [r.getMessage() for r in caplog.records if "ready in" in r.getMessage()]
    assert line.startswith("1 CPU worker ready in ") and "data plane" in line and "start " in line, line
