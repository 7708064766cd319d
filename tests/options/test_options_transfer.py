"""The transfer options (``transfer-connections``, ``transfer-message-bytes``): how they
resolve, and that they reach the workers of every launcher as distributed's config."""

from __future__ import annotations

import os
import subprocess
import sys

import dask.config
import pytest
import yaml

from spillway.options.errors import OptionsError
from spillway.launch import open_cluster
from spillway.launch.worker_config import worker_config
from spillway.options.settings import Options

KEYS = {
    "incoming": "distributed.worker.connections.incoming",
    "outgoing": "distributed.worker.connections.outgoing",
    "message": "distributed.worker.transfer.message-bytes-limit",
}


# --- resolving


def test_unset_by_default_and_leaves_distributed_alone():
    options = Options.resolve()
    assert options.transfer_connections is None and options.transfer_message_bytes == "auto"
    assert worker_config(options, tiered_store=False, gpu=False) == {}
    # null keeps distributed's default on GPU workers too
    gpu = worker_config(Options.resolve(transfer_message_bytes=None), tiered_store=False)
    assert "distributed.worker.transfer.message-bytes-limit" not in gpu


def test_gpu_workers_with_the_data_plane_fetch_up_to_a_gib_from_a_peer_at_once():
    key = "distributed.worker.transfer.message-bytes-limit"
    assert worker_config(Options.resolve(), tiered_store=False)[key] == 2**30
    assert key not in worker_config(Options.resolve(data_plane=False), tiered_store=False)
    assert worker_config(Options.resolve(transfer_message_bytes="64MiB"), tiered_store=False, gpu=False)[key] == 2**26


def test_flags_environment_and_dask_config_set_them(monkeypatch, tmp_path):
    flags = Options.resolve({"transfer_connections": "4", "transfer_message_bytes": "1GB"})
    assert (flags.transfer_connections, flags.transfer_message_bytes) == (4, 1_000_000_000)
    assert flags.sources["transfer_connections"] == "flag --transfer-connections"

    monkeypatch.setenv("DASK_SPILLWAY__TRANSFER_CONNECTIONS", "8")
    monkeypatch.setenv("DASK_SPILLWAY__TRANSFER_MESSAGE_BYTES", "256MiB")
    env = Options.resolve()
    assert (env.transfer_connections, env.transfer_message_bytes) == (8, 256 * 2**20)
    assert env.sources["transfer_message_bytes"] == "env DASK_SPILLWAY__TRANSFER_MESSAGE_BYTES"
    monkeypatch.delenv("DASK_SPILLWAY__TRANSFER_CONNECTIONS")
    monkeypatch.delenv("DASK_SPILLWAY__TRANSFER_MESSAGE_BYTES")

    # a dask config file, as a user would write it
    (tmp_path / "spillway.yaml").write_text(yaml.safe_dump(
        {"spillway": {"transfer-connections": 2, "transfer-message-bytes": "100MB"}}))
    config = dask.config.collect(paths=[str(tmp_path)], env={})
    with dask.config.set(config):
        yaml_set = Options.resolve()
    assert (yaml_set.transfer_connections, yaml_set.transfer_message_bytes) == (2, 100_000_000)
    assert yaml_set.sources["transfer_connections"] == "dask config"
    # an explicit null keeps distributed's defaults
    assert Options.resolve(transfer_connections="null", transfer_message_bytes=None).transfer_connections is None


@pytest.mark.parametrize("key, value, message", [
    ("transfer_connections", 0, "transfer-connections: 0 must be >= 1"),
    ("transfer_connections", -3, "transfer-connections: -3 must be >= 1"),
    ("transfer_connections", "many", "transfer-connections: expected an integer, got 'many'"),
    ("transfer_connections", 2.5, "transfer-connections: expected an integer, got 2.5"),
    ("transfer_message_bytes", "0", "transfer-message-bytes: '0' is below the minimum of 1 B"),
    ("transfer_message_bytes", "lots", "transfer-message-bytes: cannot parse 'lots' as a size"),
    ("transfer_message_bytes", 0.5, "transfer-message-bytes: expected a size such as 20GB, got 0.5"),
    ("transfer_message_bytes", True, "transfer-message-bytes: expected a size such as 20GB, got True"),
])
def test_bad_values_are_one_line_errors_naming_value_and_limit(key, value, message):
    with pytest.raises(OptionsError) as e:
        Options.resolve(**{key: value})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_cli_flag_error_exits_2_before_starting():
    from click.testing import CliRunner

    from spillway.cli import main

    result = CliRunner().invoke(main, ["run", "transpose-sum", "--cpu", "--transfer-connections", "0"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == "spillway: error: transfer-connections: 0 must be >= 1"


def test_worker_config_holds_both_connection_keys_and_the_message_limit():
    options = Options.resolve(transfer_connections=4, transfer_message_bytes="1GB", memory_store="tiered")
    assert worker_config(options, tiered_store=False, gpu=False) == {
        KEYS["incoming"]: 4, KEYS["outgoing"]: 4, KEYS["message"]: 1_000_000_000}
    tiered = worker_config(options, tiered_store=True)
    assert tiered[KEYS["incoming"]] == 4 and tiered["distributed.worker.memory.spill"] is False


# --- on real workers


def _reads(client) -> dict:
    """What each worker process reads, and the limits it built from them."""
    keys = dict(KEYS)

    def read(dask_worker=None):  # nested: sent by value, the workers cannot import the tests
        import dask.config

        state = dask_worker.state
        return {
            **{name: dask.config.get(key) for name, key in keys.items()},
            "fetch_limit": state.transfer_incoming_count_limit,
            "serve_limit": dask_worker.transfer_outgoing_count_limit,
            "message_limit": state.transfer_message_bytes_limit,
        }

    return client.run(read)


@pytest.mark.timeout(120)
def test_cpu_cluster_workers_read_the_options():
    options = Options.resolve(cpu=True, n_workers=2, dashboard_address=None, transfer_connections=3,
                              transfer_message_bytes="64MB")
    with open_cluster(options) as session:
        reads = _reads(session.client)
    assert len(reads) == 2
    for got in reads.values():
        assert got == {"incoming": 3, "outgoing": 3, "message": 64_000_000,
                       "fetch_limit": 3, "serve_limit": 3, "message_limit": 64_000_000}
    # the parent's config is as it was
    assert dask.config.get(KEYS["incoming"]) == 10


@pytest.mark.timeout(120)
def test_unset_options_leave_distributeds_defaults_on_the_workers():
    with open_cluster(Options.resolve(cpu=True, n_workers=1, dashboard_address=None)) as session:
        (got,) = _reads(session.client).values()
    assert (got["incoming"], got["outgoing"], got["message"]) == (10, 50, "50MB")
    assert got["message_limit"] == 50_000_000


# --- workers started by a batch script or MPI ranks


def test_batch_script_exports_the_workers_config_for_dask_to_read(tmp_path):
    from spillway.launch.slurm_batch import JobSettings, Run, job_script

    options = Options.resolve(transfer_connections=6, transfer_message_bytes="2GB", memory_store="tiered")
    text = job_script(options, JobSettings(nodes=1, gpus_per_node=2, time="01:00:00"), [Run("transpose-sum")])
    exports = dict(line[len("export "):].split("=", 1) for line in text.splitlines() if line.startswith("export "))
    assert exports["DASK_DISTRIBUTED__WORKER__CONNECTIONS__INCOMING"] == "6"
    assert exports["DASK_DISTRIBUTED__WORKER__TRANSFER__MESSAGE_BYTES_LIMIT"] == "2000000000"
    # batch workers keep dask-cuda's store: the memory monitor stays on
    assert not any("MEMORY" in k for k in exports)
    # a fresh process with these variables, as `dask worker` would start, reads them
    code = ("import dask.config, distributed, json; print(json.dumps([dask.config.get(k) for k in "
            f"{list(KEYS.values())!r}]))")
    env = {k: v for k, v in exports.items() if k.startswith("DASK_DISTRIBUTED__WORKER")}
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[6, 6, 2000000000]"
    unset = job_script(Options.resolve(), JobSettings(nodes=1, gpus_per_node=2, time="01:00:00"),
                       [Run("transpose-sum")])
    assert "DASK_DISTRIBUTED__WORKER__CONNECTIONS" not in unset


def test_mpi_ranks_build_their_workers_under_the_options_config(monkeypatch):
    pytest.importorskip("mpi4py")
    dask_mpi = pytest.importorskip("dask_mpi")
    from spillway.launch import mpi as launch

    seen = {}

    def execute(client, comm=None, **kwargs):
        # where a worker rank constructs its worker (and its nanny copies the config)
        seen.update({name: dask.config.get(key) for name, key in KEYS.items()})

    class World:
        def Get_rank(self):
            return 1

        def Get_size(self):
            return 2

        def Split_type(self, _kind):
            return self

        def allgather(self, rank):
            return [0, rank]

    monkeypatch.setattr(dask_mpi, "execute", execute)
    options = Options.resolve(cpu=True, transfer_connections=5, transfer_message_bytes="300MB")
    assert launch.run(options, lambda session: {}, comm=World()) is None
    assert seen == {"incoming": 5, "outgoing": 5, "message": 300_000_000}
    assert dask.config.get(KEYS["incoming"]) == 10  # only for the ranks' workers


# --- transfer-offload: where a worker (de)serializes a large message


def test_offload_off_on_gpu_workers_by_default_and_set_as_bytes():
    default = Options.resolve()
    assert default.transfer_offload == "auto"
    # GPU workers never hop to the offload thread; CPU workers keep distributed's threshold
    message = {"distributed.worker.transfer.message-bytes-limit": 2**30}  # the data plane's default
    assert worker_config(default, tiered_store=False) == {"distributed.comm.offload": 2**40, **message}
    assert worker_config(default, tiered_store=False, gpu=False) == {}
    assert worker_config(Options.resolve(transfer_offload=None), tiered_store=False) == message
    options = Options.resolve(transfer_offload="1TiB")
    assert options.transfer_offload == 2**40
    assert worker_config(options, tiered_store=False) == {"distributed.comm.offload": 2**40, **message}
    with pytest.raises(OptionsError) as e:
        Options.resolve(transfer_offload="lots")
    assert str(e.value).startswith("transfer-offload: cannot parse 'lots' as a size") and "\n" not in str(e.value)


def test_follow_offload_config_moves_distributeds_threshold():
    from distributed.comm import utils

    from spillway.launch.worker_config import follow_offload_config

    before = utils.OFFLOAD_THRESHOLD
    try:
        with dask.config.set({"distributed.comm.offload": "64MiB"}):
            assert follow_offload_config() == 64 * 2**20 == utils.OFFLOAD_THRESHOLD
        with dask.config.set({"distributed.comm.offload": False}):
            assert follow_offload_config() is False
    finally:
        utils.OFFLOAD_THRESHOLD = before
    # the config as distributed ships it: the module keeps its own reading
    assert follow_offload_config() == before == 10 * 2**20


def _offload_thresholds(client) -> list:
    def read(dask_worker=None):  # nested: sent by value
        from distributed.comm import utils

        return utils.OFFLOAD_THRESHOLD

    return list(client.run(read).values())


@pytest.mark.timeout(120)
def test_cpu_cluster_workers_follow_transfer_offload():
    # the worker processes imported distributed before their nanny set the config
    with open_cluster(Options.resolve(cpu=True, n_workers=2, dashboard_address=None,
                                      transfer_offload="1GiB")) as session:
        assert _offload_thresholds(session.client) == [2**30, 2**30]
    with open_cluster(Options.resolve(cpu=True, n_workers=1, dashboard_address=None)) as session:
        assert _offload_thresholds(session.client) == [10 * 2**20]

