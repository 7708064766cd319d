"""The service's systemd unit and environment file, rendered from its settings and the
options by plain functions; the files shipped beside them."""


from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spillway.options.errors import OptionsError
from spillway.options.settings import OPTIONS, Options

HERE = Path(__file__).parent


@dataclass(frozen=True, kw_only=True)
class ServiceSettings:
    executable: str = "/opt/spillway/venv/bin/spillway"
    user: str = "spillway"
    env_file: str = "/etc/spillway/spillway.env"
    state_dir: str = "/var/lib/spillway"
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    #: directories besides the state directory the service writes (a --results-dir
    #: elsewhere): the only others writable under ProtectSystem=strict
    read_write_paths: tuple[str, ...] = ()

    def __post_init__(self):
        for key in ("executable", "user", "env_file", "state_dir", "http_host"):
            value = getattr(self, key)
            if not value or any(c.isspace() for c in value):
                raise OptionsError(f"{key.replace('_', '-')}: {value!r} must be one word without spaces")
        for path in self.read_write_paths:
            if not path.startswith("/") or any(c.isspace() for c in path):
                raise OptionsError(f"read-write-paths: {path!r} must be an absolute path without spaces")
        if not 1 <= int(self.http_port) <= 65535:
            raise OptionsError(f"http-port: {self.http_port} must be in [1, 65535]")


def unit(settings: ServiceSettings = ServiceSettings()) -> str:
    """The ``spillway.service`` unit text."""
    return f"""\
[Unit]
Description=spillway: chunked array workflows on a Dask-CUDA cluster (HTTP service)
After=network-online.target
Wants=network-online.target

[Service]
Type=exec
User={settings.user}
Group={settings.user}
# cluster settings (DASK_SPILLWAY__*) and the service's address live in this file
EnvironmentFile={settings.env_file}
ExecStart={settings.executable} serve --host ${{SPILLWAY_HTTP_HOST}} --port ${{SPILLWAY_HTTP_PORT}}
# SIGTERM lets the service stop its cluster; whatever is left after the timeout is killed
KillMode=mixed
TimeoutStopSec=120
Restart=on-failure
RestartSec=10
StateDirectory={Path(settings.state_dir).name}
StateDirectoryMode=0700
UMask=0077
# the service's temporary files, and its cluster's, are its own (serve also keeps them in
# the state directory): no other local user can plant links where it writes
PrivateTmp=yes
NoNewPrivileges=yes
# the file system read-only but for the state directory (and ReadWritePaths); the data
# directories stay readable, home directories included, so tenants' stores can live there
ProtectSystem=strict
ProtectHome=read-only
ReadWritePaths={" ".join((settings.state_dir, *settings.read_write_paths))}
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
LockPersonality=yes
# not set, for what the cluster needs: PrivateDevices (the GPUs' /dev/nvidia*),
# MemoryDenyWriteExecute (Numba's and CuPy's compiled kernels), RestrictAddressFamilies
# and SystemCallFilter (UCX over InfiniBand and CUDA IPC)
# UCX registers (pins) host memory for transfers between GPUs and nodes
LimitMEMLOCK=infinity
LimitNOFILE=65536

[Install]
WantedBy=multi-user.target
"""


def _env_value(key: str, value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if "\n" in text or '"' in text:
        raise OptionsError(f"{key}: {text!r} cannot be written to an environment file")
    return text


def environment_file(options: Options, settings: ServiceSettings = ServiceSettings()) -> str:
    """The environment file: the service's address and state directory, and every
    cluster setting of ``options`` that differs from the packaged default."""
    lines = [
        "# Environment of spillway.service (systemd EnvironmentFile syntax).",
        "# Cluster settings: DASK_SPILLWAY__<KEY>, as `spillway config` lists them.",
        f"SPILLWAY_HTTP_HOST={settings.http_host}",
        f"SPILLWAY_HTTP_PORT={settings.http_port}",
        f"SPILLWAY_STATE_DIR={settings.state_dir}",
    ]
    config = options.as_config()
    for o in OPTIONS:
        if config[o.key] != o.config_default:
            lines.append(f"{o.env}={_env_value(o.key, config[o.key])}")
    return "\n".join(lines) + "\n"


def shipped() -> dict[str, str]:
    """The unit and environment files in this directory."""
    return {name: (HERE / name).read_text() for name in ("spillway.service", "spillway.env")}
