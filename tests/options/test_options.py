"""The options object: parsing, validation and the precedence of its sources."""

from __future__ import annotations

import dask.config
import pytest

from spillway.options.errors import OptionsError
from spillway.options.settings import Options, fields


def test_defaults_resolve_without_gpu():
    opts = Options.resolve()
    assert opts.devices is None
    assert opts.protocol == "auto"
    assert opts.device_memory_limit == "default"
    assert opts.host == "127.0.0.1"
    assert all(opts.sources[f] == "default" for f in fields())


@pytest.mark.parametrize(
    "kwargs, value",
    [
        ({"rmm_pool_size": "20GB"}, ("rmm_pool_size", 20_000_000_000)),
        ({"rmm_pool_size": "512MiB"}, ("rmm_pool_size", 512 * 2**20)),
        ({"rmm_pool_size": 0.5}, ("rmm_pool_size", 0.5)),
        ({"rmm_pool_size": "0.9"}, ("rmm_pool_size", 0.9)),
        ({"device_memory_limit": "12GB"}, ("device_memory_limit", 12_000_000_000)),
        ({"device_memory_limit": 0}, ("device_memory_limit", 0)),
        ({"device_memory_limit": "auto"}, ("device_memory_limit", "auto")),
        ({"memory_limit": "0.25"}, ("memory_limit", 0.25)),
        ({"devices": "0,1"}, ("devices", (0, 1))),
        ({"devices": [1]}, ("devices", (1,))),
        ({"devices": "GPU-3f2a9c1e"}, ("devices", ("GPU-3f2a9c1e",))),
        ({"devices": "all"}, ("devices", None)),
        ({"protocol": "TCP"}, ("protocol", "tcp")),
        ({"nvlink": "false"}, ("nvlink", False)),
        ({"threads_per_worker": "4"}, ("threads_per_worker", 4)),
        ({"dashboard_address": ""}, ("dashboard_address", None)),
    ],
)
def test_values_parse(kwargs, value):
    opts = Options.resolve(**kwargs)
    assert getattr(opts, value[0]) == value[1]


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"rmm_pool_size": "12XB"}, "rmm-pool-size: cannot parse '12XB'"),
        ({"rmm_pool_size": -5}, "rmm-pool-size"),
        ({"rmm_pool_size": 1.5}, "neither a fraction"),
        ({"rmm_pool_size": float("nan")}, "rmm-pool-size"),
        ({"device_memory_limit": "lots"}, "device-memory-limit: cannot parse 'lots'"),
        ({"memory_limit": True}, "memory-limit"),
        ({"devices": "0,zero"}, "devices: 'zero' is neither a GPU index nor a UUID"),
        ({"devices": "0,0"}, "names a GPU twice"),
        ({"devices": [-1]}, "GPU index -1 must be >= 0"),
        ({"n_workers": 0}, "n-workers: 0 must be >= 1"),
        ({"n_workers": "two"}, "n-workers: expected an integer, got 'two'"),
        ({"threads_per_worker": 0}, "threads-per-worker: 0 must be in [1, 1024]"),
        ({"protocol": "udp"}, "protocol: 'udp' is not one of auto, ucx, tcp"),
        ({"nvlink": "maybe"}, "nvlink: expected true or false, got 'maybe'"),
        ({"scheduler_port": 70000}, "scheduler-port: 70000 must be in [0, 65535]"),
        ({"tls_ca_file": "/nonexistent/ca.pem", "tls_cert": "/x", "tls_key": "/y"}, "does not exist"),
        ({"rmm_poolsize": "1GB"}, "rmm_poolsize: not a spillway option (did you mean rmm_pool_size?)"),
    ],
)
def test_bad_values_fail_with_one_line(kwargs, fragment):
    with pytest.raises(OptionsError) as e:
        Options.resolve(**kwargs)
    message = str(e.value)
    assert fragment in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"rmm_managed_memory": True}, "managed memory cannot be used with NVLink"),
        ({"rmm_managed_memory": True, "protocol": "ucx"}, "managed memory cannot be used with NVLink"),
        ({"rmm_async": True, "rmm_managed_memory": True, "nvlink": False}, "async allocator cannot be combined"),
        ({"rmm_release_threshold": "1GB"}, "rmm-release-threshold: 1000000000 needs rmm-async true"),
        ({"rmm_maximum_pool_size": "10GB", "rmm_pool_size": None}, "needs rmm-pool-size"),
        ({"rmm_pool_size": "10GB", "rmm_maximum_pool_size": "5GB"}, "smaller than rmm-pool-size"),
        ({"rmm_async": True, "rmm_pool_size": "1GB"}, "not used with rmm-async"),
        ({"scheduler_address": "tcp://127.0.0.1:8786", "scheduler_file": "s.json"}, "give one"),
        ({"cpu": True, "devices": "0"}, "selects GPUs but cpu is true"),
    ],
)
def test_bad_combinations(kwargs, fragment):
    with pytest.raises(OptionsError, match=fragment.replace("(", r"\(")):
        Options.resolve(**kwargs)


def test_auto_pool_unless_another_allocator():
    assert Options.resolve().pool_size == 0.9
    assert Options.resolve(rmm_pool_size="20GB").pool_size == 20_000_000_000
    assert Options.resolve(rmm_pool_size=None).pool_size is None
    assert Options.resolve(rmm_async=True).pool_size is None
    assert Options.resolve(rmm_managed_memory=True, nvlink=False).pool_size is None
    assert Options.resolve(rmm_pool_size=None).uses_rmm is False
    assert Options.resolve(rmm_maximum_pool_size="100GB").rmm_maximum_pool_size == 100_000_000_000


def test_good_combinations():
    assert Options.resolve(rmm_managed_memory=True, nvlink=False).rmm_managed_memory
    assert Options.resolve(rmm_managed_memory=True, protocol="tcp").rmm_managed_memory
    opts = Options.resolve(rmm_async=True, rmm_release_threshold="8GB")
    assert opts.rmm_release_threshold == 8_000_000_000


def test_tls_files_all_or_none(tmp_path):
    files = {}
    for name in ("ca", "cert", "key"):
        path = tmp_path / f"{name}.pem"
        path.write_text("x")
        files[name] = str(path)
    with pytest.raises(OptionsError, match="all three"):
        Options.resolve(tls_ca_file=files["ca"])
    opts = Options.resolve(tls_ca_file=files["ca"], tls_cert=files["cert"], tls_key=files["key"])
    assert opts.tls_key == files["key"]


def test_precedence_config_env_flags_keywords(monkeypatch):
    with dask.config.set({"spillway.rmm-pool-size": "1GB", "spillway.threads-per-worker": 2,
                          "spillway.protocol": "tcp", "spillway.memory-limit": "3GB"}):
        monkeypatch.setenv("DASK_SPILLWAY__RMM_POOL_SIZE", "2GB")
        monkeypatch.setenv("DASK_SPILLWAY__THREADS_PER_WORKER", "3")
        monkeypatch.setenv("DASK_SPILLWAY__MEMORY_LIMIT", "4GB")
        opts = Options.resolve({"rmm_pool_size": "5GB", "threads_per_worker": None, "memory_limit": "6GB"},
                               memory_limit="7GB")
    assert opts.protocol == "tcp" and opts.sources["protocol"] == "dask config"
    assert opts.threads_per_worker == 3 and opts.sources["threads_per_worker"] == "env DASK_SPILLWAY__THREADS_PER_WORKER"
    assert opts.rmm_pool_size == 5_000_000_000 and opts.sources["rmm_pool_size"] == "flag --rmm-pool-size"
    assert opts.memory_limit == 7_000_000_000 and opts.sources["memory_limit"] == "keyword"


def test_unknown_key_in_dask_config_is_named():
    with dask.config.set({"spillway.rmm-pool-sise": "1GB"}):
        with pytest.raises(OptionsError, match=r"spillway.rmm-pool-sise \(dask config\): not a spillway option \(did you mean rmm-pool-size\?\)"):
            Options.resolve()


def test_bad_env_value_is_named(monkeypatch):
    monkeypatch.setenv("DASK_SPILLWAY__PROTOCOL", "carrier-pigeon")
    with pytest.raises(OptionsError, match="protocol: 'carrier-pigeon'"):
        Options.resolve()


def test_frozen_and_replace_validates():
    opts = Options.resolve()
    with pytest.raises(Exception):
        opts.protocol = "tcp"  # type: ignore[misc]
    assert opts.replace(protocol="tcp").sources["protocol"] == "keyword"
    with pytest.raises(OptionsError):
        opts.replace(n_workers=-1)


def test_as_config_round_trips():
    opts = Options.resolve(devices="0,1", rmm_pool_size="4GB", protocol="ucx")
    again = Options.resolve(**{k.replace("-", "_"): v for k, v in opts.as_config().items()})
    assert again == opts


# --- the user's config is checked at resolve time, by the parsers, naming where a value came from


def test_bad_environment_value_names_key_value_range_and_variable(monkeypatch):
    monkeypatch.setenv("DASK_SPILLWAY__THREADS_PER_WORKER", "0")
    with pytest.raises(OptionsError) as e:
        Options.resolve()
    assert str(e.value) == "threads-per-worker: 0 must be in [1, 1024] (from env DASK_SPILLWAY__THREADS_PER_WORKER)"


def test_bad_value_in_a_dask_config_file_says_so(tmp_path):
    (tmp_path / "spillway.yaml").write_text("spillway:\n  workers-per-gpu: 9\n  protocol: tcp\n")
    with dask.config.set(dask.config.collect(paths=[str(tmp_path)], env={})):
        with pytest.raises(OptionsError) as e:
            Options.resolve()
        # a flag or keyword that replaces the bad value is not held to it
        assert Options.resolve(workers_per_gpu=2).protocol == "tcp"
    assert str(e.value) == "workers-per-gpu: 9 must be in [1, 8] (from dask config)"


def test_a_flag_value_is_not_given_a_source():
    with pytest.raises(OptionsError) as e:
        Options.resolve({"threads_per_worker": "0"})
    assert str(e.value) == "threads-per-worker: 0 must be in [1, 1024]"


def test_a_namespace_that_is_not_a_mapping_is_named(monkeypatch):
    with dask.config.set({"spillway": 5}):
        with pytest.raises(OptionsError, match=r"^spillway \(dask config\): expected a mapping of options, got 5$"):
            Options.resolve()
    monkeypatch.setenv("DASK_SPILLWAY", "7")
    with pytest.raises(OptionsError, match=r"^spillway \(environment\): expected a mapping of options, got 7$"):
        Options.resolve()


def test_the_cli_stops_on_a_bad_environment_value_with_one_line():
    from click.testing import CliRunner

    from spillway.cli import main

    result = CliRunner().invoke(main, ["config"], env={"DASK_SPILLWAY__PROTOCOL": "carrier-pigeon"})
    assert result.exit_code == 2
    assert result.output.strip() == ("spillway: error: protocol: 'carrier-pigeon' is not one of auto, ucx, tcp "
                                     "(from env DASK_SPILLWAY__PROTOCOL)")


def test_an_auto_pool_stays_at_its_size_and_a_given_one_grows_as_set():
    """The auto pool is capped at its own size (the rest of the GPU stays for CUDA, its
    libraries and the client process); a size given grows as RMM lets it unless capped."""
    assert Options.resolve().maximum_pool_size == Options.resolve().pool_size == 0.9
    assert Options.resolve(rmm_maximum_pool_size="140GB").maximum_pool_size == 140_000_000_000
    assert Options.resolve(rmm_pool_size="20GB").maximum_pool_size is None
    assert Options.resolve(rmm_async=True).maximum_pool_size is None
    assert Options.resolve(rmm_pool_size=None).maximum_pool_size is None
