"""Workers that die while a cluster starts: the error says what their nannies said."""

from __future__ import annotations

import logging

import pytest

from spillway.options.errors import ClusterStartError, SpillwayError
from spillway.launch.deaths import start_failure, watch_worker_deaths


def test_nanny_death_messages_are_collected_at_info_and_only_inside_the_block():
    nanny = logging.getLogger("distributed.nanny")
    before = nanny.level
    with watch_worker_deaths() as deaths:
        nanny.info("Worker process %d was killed by signal %d", 678, 9)
        nanny.info("Worker process %d exited with status %d", 674, 1)
        nanny.info("Start Nanny at: 'ucx://127.0.0.1:5'")  # not a death
    nanny.info("Worker process 1 was killed by signal 9")  # after the block
    assert deaths.messages == ["Worker process 678 was killed by signal 9",
                               "Worker process 674 exited with status 1"]
    assert nanny.level == before


def test_a_quieted_nanny_logger_still_drops_its_other_info_messages(monkeypatch):
    from spillway.launch import deaths as deaths_module

    nanny = logging.getLogger("distributed.nanny")
    # a listener of this process's own (a nanny an earlier test left running keeps one)
    # would hold the logger at INFO already: this test starts from none
    monkeypatch.setattr(deaths_module, "_LISTENING", deaths_module._Listening())
    monkeypatch.setattr(nanny, "filters", [])
    monkeypatch.setattr(nanny, "handlers", [])
    seen = []

    class Seen(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    outside = Seen(logging.DEBUG)
    nanny.addHandler(outside)
    before = nanny.level
    nanny.setLevel(logging.WARNING)
    try:
        with watch_worker_deaths() as deaths:
            nanny.info("Closing Nanny at 'tcp://127.0.0.1:1'")
            nanny.info("Worker process 7 was killed by signal 9")
            nanny.warning("Worker process still alive after 4.0 seconds, killing")
        assert deaths.messages == ["Worker process 7 was killed by signal 9"]
        assert seen == ["Worker process 7 was killed by signal 9",
                        "Worker process still alive after 4.0 seconds, killing"]
        assert nanny.level == logging.WARNING and not nanny.filters
    finally:
        nanny.removeHandler(outside)
        nanny.setLevel(before)


def test_a_killed_worker_names_the_out_of_memory_killer():
    error = start_failure(2, 0, 120, ["Worker process 678 was killed by signal 9"] * 2)
    assert isinstance(error, ClusterStartError) and isinstance(error, SpillwayError)
    message = str(error)
    assert "\n" not in message
    assert message.startswith("0 of 2 workers started within 120 s: Worker process 678 was killed by signal 9 (")
    assert message.count("Worker process 678") == 1  # repeats said once
    assert "out-of-memory killer" in message and "pinned-pool-size" in message


def test_no_death_points_at_the_worker_logs():
    message = str(start_failure(4, None, 60, []))
    assert message == "4 workers started within 60 s: no worker process died; see the workers' logs"


def test_open_cluster_turns_a_start_timeout_into_the_nannies_story(monkeypatch):
    """The real open_cluster path, with a launcher whose worker never arrives."""
    import spillway.launch.session as launch
    from spillway.options.settings import Options

    class Client:
        status = "running"

        def __init__(self):
            self.closed = False

        def wait_for_workers(self, n, timeout):
            logging.getLogger("distributed.nanny").info("Worker process 42 was killed by signal 9")
            raise TimeoutError(f"Only 0/{n} workers arrived after {timeout}")

        class scheduler:  # noqa: N801 (the client's rpc to its scheduler)
            @staticmethod
            def identity(n_workers=0):
                return {"workers": {}}

        def sync(self, func, *args, **kwargs):
            return func(*args, **kwargs)

        def close(self):
            self.closed = True

    client = Client()
    monkeypatch.setattr(launch, "start_cluster", lambda options, plan, specs=(): None)
    monkeypatch.setattr(launch, "connect_client", lambda options, cluster: client)
    with pytest.raises(ClusterStartError, match=r"^0 of 2 workers started within 120 s: Worker process 42 was killed by signal 9"):
        with launch.open_cluster(Options.resolve(cpu=True, n_workers=2)):
            pass
    assert client.closed


def test_death_reasons_by_pid_with_out_of_memory():
    from spillway.launch.deaths import death_reasons

    messages = ["Worker process 11 was killed by signal 9",
                "Worker tcp://127.0.0.1:5 (pid=12) exceeded 95% memory budget",
                "Worker process 12 was killed by signal 15",
                "Worker process 13 exited with status 1"]
    assert death_reasons(messages) == {
        11: "killed by signal 9",
        12: "out of memory: exceeded 95% memory budget, killed by signal 15",
        13: "exited with status 1",
    }
