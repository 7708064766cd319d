"""Real servers for the service tests: a CPU cluster kept up with `spillway up` and
`spillway serve` processes on loopback, each bounded in time and stopped; PostgreSQL helpers."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

START_TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spillway(*args: str, timeout: float = 60, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spillway", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def add_tenant(state: dict, name: str, *extra: str) -> str:
    """A new tenant's token, through the real `spillway tenant add`."""
    out = spillway("tenant", "add", name, *extra, *state_args(state))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def state_args(state: dict) -> list[str]:
    args = ["--state-dir", state["state_dir"]]
    if state.get("db"):
        args += ["--db", state["db"]]
    return args


class Server:
    """One `spillway serve` process."""

    def __init__(self, state: dict, *cluster_args: str, https: tuple[str, str] | None = None,
                 dashboard_off: bool = True):
        self.state = state
        #: pass --dashboard-address "" (False: serve's own default)
        self.dashboard_off = dashboard_off
        self.cluster_args = cluster_args
        self.https = https
        self.port = free_port()
        scheme = "https" if https else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log = Path(state["state_dir"]) / f"serve-{self.port}.log"

    def start(self):
        args = [sys.executable, "-m", "spillway", "serve", "--port", str(self.port), *state_args(self.state),
                *(("--dashboard-address", "") if self.dashboard_off else ()), *self.cluster_args]
        if self.https:
            args += ["--https-cert", self.https[0], "--https-key", self.https[1]]
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._logf = open(self.log, "ab")
        # a new session so the cluster processes it starts can be stopped with it
        self.proc = subprocess.Popen(args, stdout=self._logf, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        verify = self.verify
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"spillway serve exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2, verify=verify).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"spillway serve did not answer in {START_TIMEOUT_S} s:\n{self.log.read_text()}")

    def kill(self):
        """SIGKILL the service process alone (not a cluster it attached to)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything of its own left behind
        self._logf.close()

    def client(self, token: str | None = None, **kw) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        kw.setdefault("timeout", LIVENESS_S)
        return httpx.Client(base_url=self.url, headers=headers, verify=self.verify, **kw)

    @property
    def verify(self):
        """What clients trust: the server's own certificate under HTTPS."""
        return ssl.create_default_context(cafile=self.https[0]) if self.https else True


def owner_client(state_dir, timeout: str = "20s"):
    """The owner's trusted client of the service's cluster, through ``STATE_DIR/scheduler.json``
    (its address and the cluster's TLS files, which `serve` makes at start)."""
    import json

    from distributed import Client

    from spillway.options.settings import tls_security

    owner = json.loads((Path(state_dir) / "scheduler.json").read_text())
    tls = owner.get("tls") or {}
    return Client(owner["address"], timeout=timeout,
                  security=tls_security(tls.get("tls_ca_file"), tls.get("tls_cert"), tls.get("tls_key")))


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_state(client: httpx.Client, job_id: str, states, timeout: float = 60) -> dict:
    states = {states} if isinstance(states, str) else set(states)
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/jobs/{job_id}").json()
        if job["state"] in states:
            return job
        if time.monotonic() > deadline:
            logs = client.get(f"/jobs/{job_id}/logs").json()
            raise AssertionError(f"timed out after {timeout} s waiting for job {job_id} to reach {states}: "
                                 f"{job}\n{logs}")
        time.sleep(0.2)


# --- a CPU cluster kept up by `spillway up`, for tests that restart the service


@contextlib.contextmanager
def cpu_cluster(tmp: Path, n_workers: int = 2):
    scheduler_file = tmp / "cluster.json"
    log = open(tmp / "up.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "spillway", "up", "--cpu", "--n-workers", str(n_workers),
                             "--dashboard-address", "", "--scheduler-file-out", str(scheduler_file)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: scheduler_file.exists() or proc.poll() is not None, START_TIMEOUT_S, "spillway up")
        assert proc.poll() is None, (tmp / "up.log").read_text()
        yield str(scheduler_file)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


# --- a throwaway PostgreSQL server


class PostgresServer:
    """A PostgreSQL server on 127.0.0.1 in ``root`` (run as the postgres user under root,
    which the server refuses to run as); ``stop()`` and ``start()`` again keep its data and
    port, for outage tests."""

    def __init__(self, root: Path):
        self.initdb, self.pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
        self.root = Path(root)
        self.data = self.root / "data"
        self.port = free_port()
        self.run_as: list[str] = []
        self.url = f"postgresql://spillway@127.0.0.1:{self.port}"

    @property
    def available(self) -> bool:
        return bool(self.initdb and self.pg_ctl)

    def init(self):
        if os.geteuid() == 0:
            import pwd

            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.run_as = ["runuser", "-u", "postgres", "--"]
        subprocess.run([*self.run_as, self.initdb, "-D", str(self.data), "-A", "trust", "-U", "spillway",
                        "--no-sync"], check=True, capture_output=True, timeout=120)
        return self.start()

    def start(self):
        subprocess.run([*self.run_as, self.pg_ctl, "-D", str(self.data), "-l", str(self.root / "log"), "-w",
                        "-t", "60", "-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                        "-c fsync=off", "start"], check=True, capture_output=True, timeout=90)
        return self

    def stop(self, mode: str = "immediate"):
        subprocess.run([*self.run_as, self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "stop"],
                       capture_output=True, timeout=60)


def pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def new_database(base_url: str) -> str:
    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(base_url + "/postgres",
                         autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{base_url}/{name}"


def jobs_json(client: httpx.Client, **params) -> list[dict]:
    r = client.get("/jobs", params={"limit": 1000, **params})
    assert r.status_code == 200, r.text
    return r.json()["jobs"]




def postgres_if_installed(request, state: dict) -> dict:
    """``state`` on a new database of the session's PostgreSQL server where its binaries
    are installed, else left on SQLite; for tests that keep an audit on PostgreSQL."""
    import pytest

    try:
        state["db"] = new_database(request.getfixturevalue("postgres_server"))
    except pytest.skip.Exception:
        pass
    return state


async def slow_clients(port: int, sources: list[str], n: int, interval: float, duration: float, *,
                       first: bytes = b"GET /healthz HTTP/1.1\r\nHost: x\r\n", drip: bytes = b"X-a: b\r\n",
                       reading: bool = True, batch: int = 200, pace_s: float = 0.0) -> list[dict]:
    """``n`` connections from ``sources`` (round robin, connected ``batch`` at a time), each
    sending ``first`` (the start of a request) and then one byte of ``drip`` (header lines,
    never ending the headers; or a body) every ``interval`` s, for ``duration`` s; with
    ``reading`` false, sending ``first`` alone and reading nothing (a slow reader: its
    receive buffer is made small) until the end, when what the server did is read. Per
    connection: when it opened, when the server closed it, its answer (its status line, and
    its first 2,000 bytes as ``text``), or the connect's error."""
    import socket as socket_module

    loop = asyncio.get_running_loop()
    records: list[dict] = []

    class Slow(asyncio.Protocol):
        def __init__(self, rec):
            self.rec, self.transport, self.i = rec, None, 0

        def connection_made(self, transport):
            self.transport = transport
            self.rec["opened"] = time.monotonic()
            if not reading:
                transport.pause_reading()
            transport.write(first)

        def data_received(self, data):
            self.rec.setdefault("answer", data.split(b"\r\n", 1)[0].decode("latin1"))
            if len(self.rec.get("text", b"")) < 2000:  # the answer's start, its body's reason with it
                self.rec["text"] = (self.rec.get("text", b"") + data)[:2000]

        def connection_lost(self, exc):
            self.rec["closed"] = time.monotonic()
            if exc is not None:
                self.rec["lost"] = type(exc).__name__

        def drip(self):
            if reading and drip and "closed" not in self.rec and not self.transport.is_closing():
                self.transport.write(drip[self.i % len(drip):self.i % len(drip) + 1])
                self.i += 1

    async def one(k):
        rec = {"source": sources[k % len(sources)]}
        records.append(rec)
        try:
            if reading:
                _, proto = await asyncio.wait_for(loop.create_connection(
                    lambda: Slow(rec), "127.0.0.1", port, local_addr=(rec["source"], 0)), 10)
            else:  # the receive buffer made small before the connect, when its window is set
                sock = socket_module.socket()
                sock.setsockopt(socket_module.SOL_SOCKET, socket_module.SO_RCVBUF, 4096)
                sock.bind((rec["source"], 0))
                sock.setblocking(False)
                await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), 10)
                _, proto = await loop.create_connection(lambda: Slow(rec), sock=sock)
        except (OSError, asyncio.TimeoutError) as e:
            rec["error"] = type(e).__name__
            return None
        return proto

    protos = []
    for start in range(0, n, batch):  # batches of connects, ``pace_s`` apart
        protos += [p for p in await asyncio.gather(*(one(k) for k in range(start, min(n, start + batch)))) if p]
        await asyncio.sleep(pace_s)
    end = time.monotonic() + duration
    while time.monotonic() < end and any("closed" not in r for r in records if "error" not in r):
        for p in protos:
            p.drip()
        await asyncio.sleep(interval)
    if not reading:  # what the server did meanwhile: a reset, or the answers it sent
        for p in protos:
            if not p.transport.is_closing():
                p.transport.resume_reading()
        await asyncio.sleep(1.0)
    for p in protos:
        if "closed" not in p.rec:
            p.transport.abort()
    await asyncio.sleep(0.2)
    return records


#: seconds past which a request the service should answer counts as not answered: a
#: liveness deadline, not a latency target (those are benchmarks/service/latency.py's)
LIVENESS_S = 60


def record_figures(name: str, figures: dict) -> None:
    """Append a test's timing figures to ``$SPILLWAY_LATENCY_OUT`` (one JSON object a line),
    where benchmarks/service/latency.py compares them with their targets."""
    import json
    import os

    out = os.environ.get("SPILLWAY_LATENCY_OUT")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"name": name, **figures}) + "\n")


def healthz_once(port: int, source: str = "127.0.0.1") -> tuple[float, int | str]:
    """A fresh connection's GET /healthz, as a load balancer's health check does it; one
    not answered within :data:`LIVENESS_S` is a ``TimeoutError``."""
    start = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=LIVENESS_S, source_address=(source, 0)) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else "reset"
    except OSError as e:
        status = type(e).__name__
    return time.perf_counter() - start, status


def submit_job(jobdb, tenant, key=None, **kw):
    """A small job of ``tenant`` straight into the job database (no HTTP)."""
    args = dict(workflow="transpose-sum", params={"size": "40x40"}, verify=False, priority=0,
                idempotency_key=key, footprint_bytes=1000)
    args.update(kw)
    return jobdb.submit(tenant, **args)


# --- another local user


STRANGER = "spillway-stranger"


def stranger():
    """The ``pwd`` entry of a second local user (``spillway-stranger``, added with
    ``useradd`` where missing). Switching to it needs root: elsewhere the calling test is
    skipped saying so."""
    import pwd

    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root: the attempts run as a second local user, switched to with setuid")
    try:
        return pwd.getpwnam(STRANGER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", STRANGER],
                       check=True, capture_output=True, timeout=60)
        return pwd.getpwnam(STRANGER)


def open_the_way(path: Path, top: Path | None = None) -> None:
    """Let anyone pass through (not list) ``path`` and the directories above it, up to
    ``top`` (the temporary directory by default): a test's own directories are private to
    root, and what is tried as another user must be kept from it by the service's own
    modes, not by the test's."""
    import tempfile

    top = Path(top or tempfile.gettempdir())
    for directory in [Path(path), *Path(path).parents]:
        if directory == top or directory == directory.parent:
            break
        os.chmod(directory, os.stat(directory).st_mode | 0o011)


def passable_by_others(path: Path) -> bool:
    """Whether a user of no group of ours may pass through ``path`` and every directory above it."""
    import stat

    return all(os.stat(d).st_mode & stat.S_IXOTH for d in [Path(path), *Path(path).parents])


def temp_dir_others_reach(prefix: str) -> Path:
    """A new directory of ours (mode 0711) that another local user can pass through (the
    postgres user that runs the tests' PostgreSQL under root, the stranger a test tries the
    service's files and ports as): under the temporary directory where the way to it is
    open to others, else under the first of /tmp, /var/tmp, /dev/shm that is. A private
    TMPDIR (0700, as a CI may set) would keep that user out of everything made under it:
    PostgreSQL would not start, and a stranger's attempts would be refused for the test's
    modes instead of the service's. The caller removes it."""
    import tempfile

    for base in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(base) and passable_by_others(Path(base)):
            made = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
            os.chmod(made, 0o711)
            return made
    import pytest

    pytest.skip("no temporary directory another user can pass through (TMPDIR, /tmp, /var/tmp, /dev/shm)")
