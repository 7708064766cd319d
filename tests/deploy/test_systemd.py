"""The systemd unit and environment file of the long-running service."""

from __future__ import annotations

import configparser
import os

import dask.config
import pytest

from spillway.deploy.systemd import ServiceSettings, environment_file, shipped, unit
from spillway.options.errors import OptionsError
from spillway.options.settings import Options


def test_shipped_files_are_the_default_rendering():
    files = shipped()
    assert files["spillway.service"] == unit()
    assert files["spillway.env"] == environment_file(Options())


def test_unit_runs_serve_with_its_environment_file():
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.optionxform = str
    parser.read_string(unit(ServiceSettings(executable="/srv/venv/bin/spillway", user="gpu", http_port=9000)))
    service = parser["Service"]
    assert service["ExecStart"].startswith("/srv/venv/bin/spillway serve --host ${SPILLWAY_HTTP_HOST}")
    assert service["EnvironmentFile"] == "/etc/spillway/spillway.env"
    assert service["User"] == "gpu" and service["KillMode"] == "mixed"
    assert parser["Install"]["WantedBy"] == "multi-user.target"


def test_environment_file_round_trips_through_options(monkeypatch):
    options = Options(rmm_pool_size="20GB", protocol="ucx", devices="0,1", dashboard_address=None,
                      memory_limit=0.5)
    text = environment_file(options, ServiceSettings(http_port=9000))
    env = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert env["SPILLWAY_HTTP_PORT"] == "9000"
    assert env["DASK_SPILLWAY__RMM_POOL_SIZE"] == "20000000000"
    # what the service will resolve from that environment is the same options
    for key in [k for k in os.environ if k.startswith("DASK_SPILLWAY__")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with dask.config.set({"spillway": {}}):
        assert Options.resolve() == options


def test_defaults_write_no_cluster_setting():
    lines = environment_file(Options()).splitlines()
    assert not [line for line in lines if line.startswith("DASK_SPILLWAY__")]


@pytest.mark.parametrize("kwargs,message", [
    (dict(user="a b"), "user: 'a b' must be one word"),
    (dict(http_port=0), "http-port: 0 must be in [1, 65535]"),
])
def test_bad_service_settings(kwargs, message):
    with pytest.raises(OptionsError) as e:
        ServiceSettings(**kwargs)
    assert str(e.value).startswith(message)


def test_unit_keeps_the_service_to_its_own_files():
    """issue 74: another local user planted links in the shared temporary directory."""
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.optionxform = str
    parser.read_string(unit(ServiceSettings(state_dir="/var/lib/spillway", read_write_paths=("/srv/results",))))
    service = parser["Service"]
    for key, value in {"PrivateTmp": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
                       "ProtectHome": "read-only", "UMask": "0077", "StateDirectoryMode": "0700",
                       "RestrictSUIDSGID": "yes", "ProtectKernelTunables": "yes"}.items():
        assert service[key] == value, key
    assert service["ReadWritePaths"].split() == ["/var/lib/spillway", "/srv/results"]
    # the GPUs stay reachable: no PrivateDevices
    assert "PrivateDevices" not in service
    with pytest.raises(OptionsError, match="read-write-paths: 'results' must be an absolute path"):
        ServiceSettings(read_write_paths=("results",))
