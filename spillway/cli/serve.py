"""``spillway serve`` (the shared cluster service) and ``spillway tenant`` (its tenants)."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from pathlib import Path

import click

from .errors import fail_cleanly
from .interrupts import stopping
from .group import CONTEXT
from .options import cluster_options, resolve
from .state import open_jobdb, open_tenants, say_state, state_text, with_state
from spillway.service.jobdb.models import DEFAULT_MAX_QUEUED, DEFAULT_MAX_RUNNING
from spillway.service.jobdb.private import private_directory

def service_cluster_options(func):
    """The cluster flags of ``spillway up``, except ``--host``: here ``--host`` is the
    HTTP address, and the scheduler keeps the configured address (loopback by default,
    set with ``DASK_SPILLWAY__HOST``), so tenants reach the cluster only through the API."""
    wrapped = cluster_options(func)

    @functools.wraps(wrapped)
    def wrapper(*args, **kwargs):
        return wrapped(*args, host=None, **kwargs)

    wrapper.__click_params__ = [p for p in wrapped.__click_params__ if p.name != "host"]
    return wrapper


def limit_options(func):
    """The flags of :class:`spillway.service.api.settings.ServiceLimits`, made from its fields
    (where each flag, default and help is declared)."""
    from spillway.service.api.settings import setting_fields

    for field in reversed(setting_fields()):
        meta = field.metadata
        func = click.option(meta["flag"], field.name, default=None if meta["multiple"] else meta["shown"],
                            show_default=not meta["multiple"], type=meta["type"], multiple=meta["multiple"],
                            envvar=meta["env"], help=meta["help"])(func)
    return func


@click.command(context_settings=CONTEXT)
@click.option("--host", "http_host", default="127.0.0.1", show_default=True,
              help="Address the HTTP API listens on (0.0.0.0 for every interface).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="Port of the HTTP API.")
@with_state
@click.option("--results-dir", default=None, type=click.Path(file_okay=False),
              help="Where jobs' Zarr outputs are written, one store per job [default: STATE_DIR/results]; "
                   "a directory the owner's analysis machines also see, for results read in place.")
@click.option("--data-dir", "data_dirs", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="A directory tenants without data directories of their own (`spillway tenant add NAME "
                   "--data DIR`) may name Zarr inputs in (repeatable); without one, their jobs use generated "
                   "inputs only.")
@click.option("--https-cert", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Serve HTTPS with this certificate (PEM); needs --https-key.")
@click.option("--https-key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Private key (PEM) of --https-cert.")
@limit_options
@service_cluster_options
@fail_cleanly
def serve(http_host, port, state_dir, db, results_dir, data_dirs, https_cert, https_key, options_flags,
          **limit_flags):
    """Serve the shared cluster service: an authenticated HTTP API with a persistent,
    prioritised job queue, tenants, a web page (/ui) and Prometheus metrics (/metrics).

    Starts the cluster from the same options as `spillway up`, or attaches to one with
    --scheduler-file / --scheduler-address. The scheduler file for the owner's trusted
    direct access is written to STATE_DIR/scheduler.json (readable by the owner only).
    The cluster opens no HTTP port (no dashboard unless --dashboard-address is given) and
    its workers' scratch is STATE_DIR/scratch (0700) unless --local-directory is given.

    \b
    Examples:
      spillway tenant add alice --create            # prints alice's token once
      spillway serve --port 8000 --rmm-pool-size 100GB
      spillway serve --cpu --n-workers 4 --db postgresql://spillway@db/spillway
      spillway serve --host 0.0.0.0 --https-cert cert.pem --https-key key.pem
    """
    import uvicorn

    from spillway.service.api import create_app
    from spillway.service.api.connections import ConnectionStats, guarded_protocol, raise_fd_limit
    from spillway.service.api.settings import ServiceLimits
    from spillway.service.jobs import JobQueue
    from spillway.options.errors import OptionsError
    from spillway.launch import open_cluster

    if bool(https_cert) != bool(https_key):
        raise click.UsageError("--https-cert and --https-key go together")
    try:
        state = private_directory(state_dir)
    except OSError as e:
        raise OptionsError(f"state-dir: cannot write in {str(state_dir)!r} ([Errno {e.errno}] {e.strerror})") from None
    # put back when the command ends: a caller in this process (a test, a notebook) keeps
    # its own temporary directory after the service stops
    click.get_current_context().call_on_close(_private_temporary(state))
    options = _private_cluster(_with_security(resolve(options_flags)), state)
    limits = ServiceLimits(**limit_flags)
    fd_soft, _ = raise_fd_limit(limits.max_connections)
    if not https_cert and http_host not in LOOPBACK:
        click.echo(f"spillway: warning: plain HTTP on {http_host}: tokens cross the network in clear; "
                   "use --https-cert/--https-key or a TLS proxy", err=True)
    jobdb = open_jobdb(state_dir, db)
    _notice_old_limits(jobdb)
    # what the service and its workers write (results, logs, the TLS files) is the owner's alone
    os.umask(0o077)
    results = Path(results_dir or Path(state_dir).expanduser() / "results").expanduser()
    try:
        results.mkdir(parents=True, exist_ok=True)
        # each tenant's results in a 0700 directory of their own; this one may be passed
        # through, not listed
        os.chmod(results, 0o711)
        tempfile.TemporaryFile(dir=results).close()
    except OSError as e:
        raise OptionsError(f"results-dir: cannot write in {str(results)!r} ([Errno {e.errno}] {e.strerror})") from None
    tenants_dirs = {t["name"]: t["data_dirs"] for t in jobdb.tenants() if t.get("data_dirs") and not t["revoked"]}
    _check_apart(results, data_dirs, tenants_dirs)
    # the API's port is taken before the cluster: a port in use is a one-line error before
    # any worker starts, and none of the cluster's own listeners can take it meanwhile
    listener = _listen(http_host, port)
    port = listener.getsockname()[1]
    scheme = "https" if https_cert else "http"
    # uvicorn stops the API on Ctrl-C or SIGTERM, then raises the signal again here: the
    # cluster closes and one line says so (SIGTERM, a service manager's stop, exits 0)
    with stopping("the service as its cluster started", sigterm_exit=0) as stop, listener, \
            open_cluster(options, tls_dir=Path(state_dir).expanduser() / "tls") as session:
        stop.what = (f"the service at {scheme}://{http_host}:{port} and its cluster ({session.n_workers} "
                     f"{session.kind.upper()} worker{'s' if session.n_workers != 1 else ''})")
        _write_owner_file(session, Path(state_dir).expanduser())
        _no_settles_beside_the_api(session.client)
        queue = JobQueue(jobdb, session, results_dir=str(results.resolve()), input_roots=data_dirs)
        queue.start()
        try:
            connections = ConnectionStats()
            app = create_app(jobdb, queue, limits=limits, connections=connections)
            app.state.known_tokens.refresh()
            click.echo("tenants without data directories of their own read inputs under "
                       + (", ".join(queue.input_roots) + " (--data-dir)" if queue.input_roots
                          else "none: generated inputs only (no --data-dir)")
                       + f"; {len(tenants_dirs)} tenant(s) have their own", err=True)
            click.echo(f"serving {scheme}://{http_host}:{port}  ({session.n_workers} {session.kind} workers, "
                       f"scheduler {session.scheduler_address}; {state_text(state_dir, db)}; at most "
                       f"{limits.max_connections} connections, "
                       f"{limits.max_connections_per_client} per client, headers within "
                       f"{limits.header_timeout_s:g} s; file descriptors {fd_soft})", err=True)
            # no WebSocket routes; X-Forwarded-For believed from the trusted proxies only
            config = uvicorn.Config(app, host=http_host, port=port, ssl_certfile=https_cert, ssl_keyfile=https_key,
                                    log_level="warning", access_log=False, ws="none",
                                    http=guarded_protocol(limits, connections),
                                    proxy_headers=bool(limits.trusted_proxies),
                                    forwarded_allow_ips=list(limits.trusted_proxies) or None)
            server = uvicorn.Server(config)
            server.run(sockets=[listener])
            if not server.started:
                raise SystemExit(3)  # uvicorn said why (uvicorn.run's own exit status)
        finally:
            queue.stop()
            jobdb.close()


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _listen(host: str, port: int):
    """The API's listening socket, bound as uvicorn binds it (port 0: one the kernel picks)."""
    import socket

    from spillway.options.errors import OptionsError

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:
        raise OptionsError(f"host: cannot listen on {host!r} ({e})") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.set_inheritable(True)
    except OSError as e:
        sock.close()
        raise OptionsError(f"port: cannot listen on {host}:{port} ([Errno {e.errno}] {e.strerror})") from None
    return sock


def _no_settles_beside_the_api(client) -> None:
    """A scheduler the service started runs in its process, beside the API's event loop.
    Its quiet settles (:mod:`spillway.launch.collector`) are full collections of everything
    the process holds, frozen objects included, at moments the scheduler alone judges quiet:
    each held the API for 0.12-0.17 s (270,000 objects; /healthz's worst answers under 1,200
    slow bodies, issue 63), and they grow with the process. Stopped there: the first settle,
    at start, stays, and full collections walk only what was made since. A scheduler of
    another process (an attached cluster) keeps them."""
    import logging

    from spillway.launch.collector import process_id, stop_settling

    try:
        if client.run_on_scheduler(process_id) == process_id():
            client.run_on_scheduler(stop_settling)
    except Exception as e:  # noqa: BLE001 (a scheduler without spillway has no settles to stop)
        logging.getLogger("spillway.serve").debug("the scheduler's settles stay: %s: %s", type(e).__name__, e)


def _notice_old_limits(jobdb) -> None:
    """Tenants added before schema 3 kept the old 64 GiB default limit (the database cannot
    tell it from one typed on purpose): say how to lift it."""
    from spillway.service.jobdb.schema import old_default_tenants

    names = old_default_tenants(jobdb.tenants())
    if names:
        click.echo(f"spillway: tenant(s) {', '.join(names)} keep the old default limit of 64 GiB per job; "
                   "`spillway tenant set NAME --max-job-bytes memory` lets them submit up to the cluster's memory",
                   err=True)


def _with_security(options):
    """The service's own cluster always requires TLS: with the owner's TLS files, else with a
    certificate made for it at start in STATE_DIR/tls (:mod:`spillway.launch.tls`),
    so that no other local user can send its scheduler, nannies or workers code. A cluster
    attached to keeps its own security (the TLS files, if any)."""
    from spillway.options.errors import OptionsError

    if options.attach or options.tls_ca_file or options.security:
        return options
    if options.sources.get("security", "default") != "default":
        raise OptionsError(f"security: false ({options.sources['security']}) is not for the service: its cluster "
                           "always requires TLS (a certificate made at start, or tls-ca-file, tls-cert and tls-key)")
    return options.replace(security=True)


def _private_cluster(options, state: Path):
    """The service's own cluster opens no HTTP port and keeps no file where another local
    user reaches it: the dashboard off unless the owner asks for one (it shows every
    tenant's tasks, keys and worker logs to whoever connects; with it off the workers
    start no HTTP server either: :mod:`spillway.launch.http_server`), and the
    workers' scratch (spill files, among them tenants' chunks) in STATE_DIR/scratch, made
    0700, rather than dask's shared temporary directory, which another user can make first.
    A cluster attached to keeps its own."""
    if options.attach:
        return options
    changes = {}
    if options.sources.get("dashboard_address", "default") == "default":
        changes["dashboard_address"] = None
    elif options.dashboard_address:
        click.echo(f"spillway: warning: the dashboard ({options.dashboard_address}, "
                   f"{options.sources['dashboard_address']}) and the workers' HTTP ports answer every local user "
                   "with every tenant's task keys and worker logs; leave it off on a shared machine", err=True)
    if options.sources.get("local_directory", "default") == "default":
        changes["local_directory"] = str(owned_directory(state / "scratch"))
    return options.replace(**changes) if changes else options


def _private_temporary(state: Path):
    """Every temporary file of the service and of the cluster it starts under the state
    directory, never the shared temporary directory: there another local user can make
    ``dask-scratch-space`` first and put links in it, and distributed opens its global
    and purge lock files there with ``open(path, "wb")``, following them (a
    link to the job database truncated it). The scheduler runs in this process and takes
    its workspace from dask's ``temporary-directory``; the nannies and workers inherit the
    config and the environment. STATE_DIR/tmp (Python's and child programs' TMPDIR) and
    STATE_DIR/scratch (dask's workspace), each 0700; whatever the owner's dask config
    named, since a shared directory there is the same trap. Returns what puts them back."""
    import dask.config

    from spillway.options.errors import OptionsError

    tmp, scratch = state / "tmp", state / "scratch"
    for directory in (tmp, scratch):
        try:
            owned_directory(directory)
        except OSError as e:
            raise OptionsError(f"state-dir: cannot use {str(directory)!r} ([Errno {e.errno}] {e.strerror})") from None
    before = {k: os.environ.get(k) for k in ("TMPDIR", "DASK_TEMPORARY_DIRECTORY")}
    tempdir, temporary = tempfile.tempdir, dask.config.get("temporary-directory", None)
    os.environ["TMPDIR"] = str(tmp)
    os.environ["DASK_TEMPORARY_DIRECTORY"] = str(scratch)
    tempfile.tempdir = str(tmp)
    dask.config.set({"temporary-directory": str(scratch)})

    def put_back() -> None:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        tempfile.tempdir = tempdir
        dask.config.set({"temporary-directory": temporary})

    return put_back


def owned_directory(path: Path) -> Path:
    """``path`` a directory of this user's alone (0700), made where missing. One that is a
    link, or another user's, is refused (PermissionError): what the service writes in it
    would land where someone else chose."""
    import stat

    private_directory(path)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(1, "not a directory of the service's user (a link, or another user's)")
    os.chmod(path, 0o700)  # inside the 0700 state directory: nobody swaps it after the lstat
    return path


def _check_apart(results: Path, data_dirs, tenants_dirs: dict | None = None) -> None:
    """Tenants name inputs in the data directories: results inside one would let a tenant's
    job read another tenant's outputs."""
    from spillway.options.errors import OptionsError

    mine = os.path.realpath(results)
    named = [("data-dir", d) for d in data_dirs]
    named += [(f"tenant {name}'s --data", d) for name, dirs in (tenants_dirs or {}).items() for d in dirs]
    for what, d in named:
        theirs = os.path.realpath(os.path.expanduser(d))
        if mine == theirs or mine.startswith(theirs + os.sep) or theirs.startswith(mine + os.sep):
            raise OptionsError(f"{what}: {d!r} and the results directory {str(results)!r} overlap: a tenant's job "
                               "could read another tenant's results; keep them apart")


def _write_owner_file(session, state_dir: Path):
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "scheduler.json"
    # The scheduler runs anything a client sends it, so only the owner may read where it is.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    options = session.options
    tls = ({"tls_ca_file": options.tls_ca_file, "tls_cert": options.tls_cert, "tls_key": options.tls_key}
           if options.tls_ca_file else None)
    with os.fdopen(fd, "w") as f:
        # distributed reads the address; spillway's --scheduler-file also the TLS files
        json.dump({"address": session.scheduler_address, "type": "Scheduler", **({"tls": tls} if tls else {})}, f)


@click.group(context_settings=CONTEXT)
def tenant():
    """Tenants of the shared service, their quotas and their tokens.

    Quotas: jobs queued (--max-queued, default 100), jobs running (--max-running, default 2)
    and bytes per job (--max-job-bytes, default the cluster's memory: device + host tier).

    \b
    Examples:
      spillway tenant add alice --create        # the first: makes the state directory
      spillway tenant add bob --max-running 4 --max-queued 500 --max-job-bytes 200GB
      spillway tenant add carol --data /data/carol  # reads inputs there only
      spillway tenant set alice --max-job-bytes 100GB   # (or tenant update)
      spillway tenant add ops --admin --expires-in 90d
      spillway tenant list
      spillway tenant token alice --keep-old --expires-in 30d   # rotation: a second token
      spillway tenant revoke-token alice --old                  # ... then the first goes
      spillway tenant revoke alice
    """


#: ``--max-job-bytes`` words: the cluster's memory (device + host tier, the default), and
#: what the cluster admits with its spill disk
MEMORY, CLUSTER = "memory", "cluster"


def _job_limit(value: str | None) -> int | None:
    """``--max-job-bytes``: a size, ``memory`` (the serving cluster's device memory and host
    tier; the default) or ``cluster`` (what its admission accepts, spill disk included)."""
    from spillway.service.jobdb import CLUSTER_JOB_BYTES, DEFAULT_MAX_JOB_BYTES
    from spillway.options.sizes import parse_size

    if value is None:
        return DEFAULT_MAX_JOB_BYTES
    word = value.strip().lower()
    if word == MEMORY:
        return None
    if word == CLUSTER:
        return CLUSTER_JOB_BYTES
    try:
        return parse_size(value, name="max-job-bytes", minimum=1)
    except ValueError as e:
        raise click.BadParameter(f"{e}; or 'memory' (the cluster's memory, the default) or 'cluster' (with its "
                                 "spill disk)", param_hint="--max-job-bytes") from None


def job_limit_text(limit: int | None) -> str:
    from spillway.service.jobdb import CLUSTER_JOB_BYTES
    from spillway.options.sizes import format_bytes

    if limit is None:
        return MEMORY
    return CLUSTER if limit == CLUSTER_JOB_BYTES else format_bytes(limit)


def job_limit_json(limit: int | None) -> int | str:
    """``tenant list --json``'s max_job_bytes: bytes, or the word."""
    from spillway.service.jobdb import CLUSTER_JOB_BYTES

    if limit is None:
        return MEMORY
    return CLUSTER if limit == CLUSTER_JOB_BYTES else limit


def _settings(info: dict) -> str:
    return (f"admin={str(info['admin']).lower()}, priority={info['priority']}, "
            f"max-running={info['max_running']}, max-queued={info['max_queued']}, "
            f"max-job-bytes={job_limit_text(info['max_job_bytes'])}"
            + (f", data={_data_text(info['data_dirs'])}" if info.get("data_dirs") is not None else ""))


def _data_text(dirs) -> str:
    return "the service's --data-dir" if dirs is None else (",".join(dirs) or "none")


DATA_HELP = ("A directory this tenant's jobs may read Zarr inputs in (repeatable); its only ones: a tenant given "
             "none reads under the service's --data-dir.")


MAX_JOB_BYTES_HELP = ("Largest projected footprint of one job: a size such as 200GB, 'memory' for the serving "
                      "cluster's device memory and host tier, or 'cluster' for what its admission accepts "
                      "(its spill disk included).")
MAX_QUEUED_HELP = "Jobs of this tenant that may wait in the queue at once; more are refused (429)."
MAX_RUNNING_HELP = "Jobs of this tenant that may run at once."


def expiry_options(func):
    func = click.option("--expires-at", default=None, metavar="DATE",
                        help="The token stops working at this ISO date or time (2027-01-31, UTC unless "
                             "a zone is given).")(func)
    return click.option("--expires-in", default=None, metavar="DURATION",
                        help="The token stops working after this long (30d, 12h, 90m, 2w) [default: never].")(func)


def _expiry(expires_in, expires_at):
    from spillway.service.jobdb.tokens import parse_expiry

    return parse_expiry(expires_in=expires_in, expires_at=expires_at)


def _until(expires) -> str:
    return f"until {expires.isoformat(timespec='seconds')}" if expires else "without expiry"


@tenant.command("add", context_settings=CONTEXT)
@click.argument("name")
@click.option("--admin", is_flag=True, help="The token sees and cancels every tenant's jobs.")
@click.option("--priority", default=0, show_default=True, type=click.IntRange(-100, 100),
              help="Added to each job's priority; higher runs first.")
@click.option("--max-running", default=DEFAULT_MAX_RUNNING, show_default=True, type=click.IntRange(1, 10_000),
              help=MAX_RUNNING_HELP)
@click.option("--max-queued", default=None, type=click.IntRange(1, 1_000_000),
              help=MAX_QUEUED_HELP + f"  [default: {DEFAULT_MAX_QUEUED}]")
@click.option("--max-job-bytes", default=None, metavar="SIZE|memory|cluster",
              help=MAX_JOB_BYTES_HELP + "  [default: memory]")
@click.option("--data", "data_dirs", multiple=True, type=click.Path(exists=True, file_okay=False), help=DATA_HELP)
@expiry_options
@click.option("--create", is_flag=True,
              help="Make the state directory and its database where there are none yet (the first tenant at "
                   "the default place; a --state-dir or SPILLWAY_STATE_DIR given is made without it).")
@with_state
@fail_cleanly
def tenant_add(name, admin, priority, max_running, max_queued, max_job_bytes, data_dirs, expires_in, expires_at,
               create, state_dir, db):
    """Add tenant NAME; prints its token alone on the last line (shown only this once)."""
    from .state import state_source

    limit = _job_limit(max_job_bytes)
    expires = _expiry(expires_in, expires_at)
    # a directory the user named is theirs to start; the default place only when told
    jobdb = open_tenants(state_dir, db, create=create or state_source() != "the default")
    try:
        info, token = jobdb.add_tenant(name, admin=admin, priority=priority, max_running=max_running,
                                       max_queued=max_queued, max_job_bytes=limit, expires=expires,
                                       data_dirs=list(data_dirs) if data_dirs else None)
    finally:
        jobdb.close()
    say_state(state_dir, db)
    click.echo(f"tenant {info['name']} added ({_settings(info)}); its token, valid {_until(expires)}, "
               "shown only now:")
    click.echo(token)


@tenant.command("set", context_settings=CONTEXT)
@click.argument("name")
@click.option("--priority", default=None, type=click.IntRange(-100, 100),
              help="Added to each job's priority; higher runs first.")
@click.option("--max-running", default=None, type=click.IntRange(1, 10_000), help=MAX_RUNNING_HELP)
@click.option("--max-queued", default=None, type=click.IntRange(1, 1_000_000), help=MAX_QUEUED_HELP)
@click.option("--max-job-bytes", default=None, metavar="SIZE|memory|cluster", help=MAX_JOB_BYTES_HELP)
@click.option("--data", "data_dirs", multiple=True, type=click.Path(exists=True, file_okay=False),
              help=DATA_HELP + " Replaces the tenant's directories.")
@click.option("--default-data", is_flag=True, help="The tenant reads under the service's --data-dir again.")
@with_state
@fail_cleanly
def tenant_set(name, priority, max_running, max_queued, max_job_bytes, data_dirs, default_data, state_dir, db):
    """Change tenant NAME's priority or quotas (also `tenant update`); its token and jobs
    stay. New quotas apply to jobs submitted from now on.

    \b
    Examples:
      spillway tenant set alice --max-job-bytes 100GB     # lower than the cluster's memory
      spillway tenant set alice --max-job-bytes cluster   # up to the cluster with its spill disk
      spillway tenant update bob --max-queued 1000 --max-running 4
      spillway tenant set alice --data /data/alice --data /data/shared
    """
    changes = {}
    if data_dirs and default_data:
        raise click.UsageError("--data and --default-data go apart: give one")
    if data_dirs:
        changes["data_dirs"] = list(data_dirs)
    elif default_data:
        changes["data_dirs"] = None
    if priority is not None:
        changes["priority"] = priority
    if max_running is not None:
        changes["max_running"] = max_running
    if max_queued is not None:
        changes["max_queued"] = max_queued
    if max_job_bytes is not None:
        changes["max_job_bytes"] = _job_limit(max_job_bytes)
    if not changes:
        raise click.UsageError("give --priority, --max-running, --max-queued, --max-job-bytes, --data or "
                               "--default-data")
    jobdb = open_tenants(state_dir, db)
    try:
        info = jobdb.set_tenant(name, **changes)
    finally:
        jobdb.close()
    say_state(state_dir, db)
    click.echo(f"tenant {info['name']} set ({_settings(info)})"
               + (", data=the service's --data-dir" if "data_dirs" in changes and info["data_dirs"] is None else ""))


tenant.add_command(tenant_set, "update")


@tenant.command("token", context_settings=CONTEXT)
@click.argument("name")
@click.option("--keep-old", is_flag=True,
              help="Keep NAME's other tokens valid (rotation: move clients to the new token, then "
                   "`spillway tenant revoke-token NAME --old`). Without it they are revoked now.")
@expiry_options
@with_state
@fail_cleanly
def tenant_token(name, keep_old, expires_in, expires_at, state_dir, db):
    """Issue a new token for tenant NAME; prints it alone on the last line (shown only this once)."""
    expires = _expiry(expires_in, expires_at)
    jobdb = open_tenants(state_dir, db)
    try:
        info, token = jobdb.issue_token(name, expires=expires, keep_old=keep_old)
    finally:
        jobdb.close()
    say_state(state_dir, db)
    others = "its other tokens stay valid" if keep_old else "its other tokens are revoked"
    click.echo(f"token {info['id']} of tenant {name}, valid {_until(expires)} ({others}); shown only now:")
    click.echo(token)


@tenant.command("revoke-token", context_settings=CONTEXT)
@click.argument("name")
@click.option("--id", "token_id", type=int, default=None, help="The token to revoke (`spillway tenant tokens NAME`).")
@click.option("--old", is_flag=True, help="Revoke every token of NAME but the newest (the end of a rotation).")
@with_state
@fail_cleanly
def tenant_revoke_token(name, token_id, old, state_dir, db):
    """Revoke one of tenant NAME's tokens (the tenant stays)."""
    jobdb = open_tenants(state_dir, db)
    try:
        ids = jobdb.revoke_token(name, token_id=token_id, old=old)
    finally:
        jobdb.close()
    say_state(state_dir, db)
    click.echo(f"tenant {name}: revoked token(s) {', '.join(map(str, ids))}" if ids
               else f"tenant {name}: no other valid token to revoke")


@tenant.command("tokens", context_settings=CONTEXT)
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print as one JSON list.")
@with_state
@fail_cleanly
def tenant_tokens(name, as_json, state_dir, db):
    """List tenant NAME's tokens: id, created, expiry, revocation, last use (never the tokens)."""
    jobdb = open_tenants(state_dir, db)
    try:
        rows = jobdb.tokens(name)
    finally:
        jobdb.close()
    say_state(state_dir, db)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'id':>4}  {'created':<25} {'expires':<25} {'last used':<25} state")
    for t in rows:
        click.echo(f"{t['id']:>4}  {_short(t['created']):<25} {_short(t['expires']) or 'never':<25} "
                   f"{_short(t['last_used']) or '-':<25} {_token_state(t)}")


def _short(iso: str | None) -> str:
    return iso[:19].replace("T", " ") + "Z" if iso else ""


def _token_state(t: dict) -> str:
    from datetime import datetime, timezone

    if t["revoked"]:
        return "revoked"
    if t["expires"] and datetime.fromisoformat(t["expires"]) <= datetime.now(timezone.utc):
        return "expired"
    return "valid"


@tenant.command("list", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True,
              help="Print as one JSON list (max_job_bytes: bytes, 'memory' or 'cluster').")
@with_state
@fail_cleanly
def tenant_list(as_json, state_dir, db):
    """List tenants (never their tokens)."""
    jobdb = open_tenants(state_dir, db)
    try:
        rows = jobdb.tenants()
    finally:
        jobdb.close()
    say_state(state_dir, db)
    if as_json:
        click.echo(json.dumps([{**t, "max_job_bytes": job_limit_json(t["max_job_bytes"])} for t in rows], indent=2))
        return
    click.echo(f"{'name':<20} {'admin':<6} {'priority':>8} {'running':>8} {'queued':>8} {'job bytes':>12}  "
               f"{'state':<8} {'tokens':>6}  {'expires':<21} last used")
    for t in rows:
        click.echo(f"{_shown_name(t['name']):<20} {str(t['admin']).lower():<6} {t['priority']:>8} {t['max_running']:>8} "
                   f"{t['max_queued']:>8} {job_limit_text(t['max_job_bytes']):>12}  "
                   f"{'revoked' if t['revoked'] else 'active':<8} "
                   f"{t['tokens']:>6}  {_short(t['expires']) or 'never':<21} {_short(t['last_used']) or '-'}")


def _shown_name(name: str) -> str:
    """A tenant's name for the terminal: as it is, or escaped where it holds control
    characters (a database written before names were checked)."""
    return name if name.isprintable() else repr(name)[1:-1]


@tenant.command("revoke", context_settings=CONTEXT)
@click.argument("name")
@with_state
@fail_cleanly
def tenant_revoke(name, state_dir, db):
    """Revoke tenant NAME's token at once (its jobs stay readable to an admin)."""
    jobdb = open_tenants(state_dir, db)
    try:
        jobdb.revoke_tenant(name)
    finally:
        jobdb.close()
    say_state(state_dir, db)
    click.echo(f"tenant {name} revoked")
