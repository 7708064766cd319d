"""Another local user against the ports `spillway serve` opens (issue 53): the cluster behind
the service requires TLS with a certificate made for it at start, so a process of another
uid, which finds every port in the world-readable /proc/net/tcp, can neither run code on the
scheduler, a nanny or a worker nor read what they hold; it cannot read the certificate's key
either. The HTTP API is the one door, and it wants a token.

The attempts run as a user of their own (``spillway-stranger``, added with ``useradd`` where
missing): a child that drops to its uid and gid with setuid/setgid (see :data:`ATTEMPTS`),
which needs root; elsewhere the test is skipped saying so. The data
plane is not among the ports here: it runs over UCX only and is off on these TLS clusters
(its own check of a per-cluster secret is tested over UCXX in
tests/datapath/test_dataplane.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from serve_helpers import (Server, add_tenant, open_the_way, owner_client, stranger,
                           temp_dir_others_reach, wait_state)

pytestmark = pytest.mark.slow

#: what the stranger tries on each port: distributed's protocol over plain TCP, over TLS
#: without the cluster's certificate (and with one of its own), and a Client that runs code
#: on the scheduler. The interpreter lives under /root (0700 here), so the script starts as
#: root, loads what it uses by doing it once with the cluster's certificate (read into
#: memory: the control), drops to the stranger's uid for good, tries without it, and does
#: the control again as the stranger: the refusals are the missing certificate's, not a
#: module the stranger could not read.
ATTEMPTS = r"""
import asyncio, json, os, ssl, sys
from distributed import Client
from distributed.comm import connect
from distributed.security import Security

ports, scheduler, tls, uid, gid = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
pem = {k: open(v).read() for k, v in tls.items()}
cluster = Security(tls_ca_file=pem["ca"], tls_client_cert=pem["cert"], tls_client_key=pem["key"], require_encryption=True)
own = Security.temporary()  # a certificate of the stranger's own making
out = {"ports": {}}

def no_cert_context():
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx

async def identity(url, **kw):
    comm = await connect(url, timeout=3, **kw)
    await comm.write({"op": "identity", "reply": True})
    reply = await comm.read()
    await comm.close()
    return reply

async def attempt(url, **kw):
    # an HTTP port (the dashboard's, a worker's) waits for the rest of a request: bounded
    try:
        return "answered: " + str(await asyncio.wait_for(identity(url, **kw), 5))[:100]
    except BaseException as e:
        return "refused: " + type(e).__name__

def run_on_scheduler(address, security):
    try:
        with Client(address, timeout="5s", security=security) as c:
            return "ran as uid %s" % c.run_on_scheduler(os.getuid)
    except BaseException as e:
        return "refused: " + type(e).__name__

def control(key):
    out[key] = {"identity": asyncio.run(attempt(scheduler, **cluster.get_connection_args("client"))),
                "run_on_scheduler": run_on_scheduler(scheduler, cluster)}

control("control_as_root")
asyncio.run(attempt("tcp://127.0.0.1:%d" % ports[0]))
asyncio.run(attempt("tls://127.0.0.1:%d" % ports[0], ssl_context=no_cert_context()))
run_on_scheduler(scheduler.replace("tls://", "tcp://"), None)
run_on_scheduler(scheduler, own)

os.setgroups([])
os.setgid(gid)
os.setuid(uid)
out["uid"] = os.getuid()
try:
    os.setuid(0)
    out["dropped"] = False
except PermissionError:
    out["dropped"] = True

def http_get(port):
    # what the dashboard and the workers' HTTP servers answered anyone: /metrics, /health
    import socket
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.settimeout(3)
            s.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            data = s.recv(200)
        return ("answered: " + data[:60].decode("latin1")) if data.startswith(b"HTTP/") else "refused: no HTTP"
    except BaseException as e:
        return "refused: " + type(e).__name__

async def main():
    for port in ports:
        out["ports"][str(port)] = {
            "http": http_get(port),
            "tcp": await attempt("tcp://127.0.0.1:%d" % port),
            "tls without a certificate": await attempt("tls://127.0.0.1:%d" % port, ssl_context=no_cert_context()),
            "tls with its own certificate": await attempt("tls://127.0.0.1:%d" % port,
                                                          **own.get_connection_args("client")),
        }

asyncio.run(main())
out["run_on_scheduler_tcp"] = run_on_scheduler(scheduler.replace("tls://", "tcp://"), None)
out["run_on_scheduler_own_certificate"] = run_on_scheduler(scheduler, own)
try:
    open(tls["key"]).read()
    out["key"] = "read"
except OSError as e:
    out["key"] = "refused: " + type(e).__name__
control("control_as_stranger")
print(json.dumps(out))
"""

#: what a refusal may not be: the attempt failing for want of a module or a file
NOT_A_REFUSAL = ("ImportError", "ModuleNotFoundError", "PermissionError", "NameError")


def listening_ports(pid: int) -> dict[int, str]:
    """port -> the command line of the process of ``pid``'s tree that listens on it."""
    root = psutil.Process(pid)
    found = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found[conn.laddr.port] = " ".join(proc.cmdline())[:120]
        except psutil.Error:
            continue
    return found


def test_another_local_user_reaches_nothing_but_the_api():
    """Under serve's own defaults (issue 63: the dashboard was on, and each worker served
    /metrics and /health to anyone), while a job runs: no HTTP port but the API's."""
    user = stranger()
    # not under tmp_path: a private TMPDIR would refuse the stranger everything for the test's
    # modes, and the key's refusal below would pass for the wrong reason
    base = temp_dir_others_reach("spillway-stranger-")
    try:
        _try_every_port_as(user, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _try_every_port_as(user, base: Path):
    state = {"state_dir": str(base / "state")}
    token = add_tenant(state, "ann")
    server = Server(state, "--cpu", "--n-workers", "2", dashboard_off=False)
    server.start()
    try:
        with server.client(token) as c:
            job = c.post("/jobs", json={"workflow": "transpose-sum", "params": {"size": "200x200"}}).json()
            assert wait_state(c, job["id"], "done")["state"] == "done"
            # one running while the ports are tried
            running = c.post("/jobs", json={"workflow": "transpose-sum",
                                            "params": {"size": "6000x6000", "chunks": "150x150"}}).json()
            wait_state(c, running["id"], {"running", "done", "failed"})
        scratch = Path(state["state_dir"]) / "scratch"
        assert (scratch.stat().st_mode & 0o777) == 0o700
        with owner_client(state["state_dir"]) as client:
            dirs = client.run(lambda dask_worker: dask_worker.local_directory)
        assert dirs and all(Path(d).is_relative_to(scratch) for d in dirs.values()), dirs
        owner = json.loads((Path(state["state_dir"]) / "scheduler.json").read_text())
        assert owner["address"].startswith("tls://127.0.0.1:")
        tls_dir = Path(state["state_dir"]) / "tls"
        assert (tls_dir.stat().st_mode & 0o777) == 0o700
        for name in ("ca.pem", "cert.pem", "key.pem"):
            assert ((tls_dir / name).stat().st_mode & 0o777) == 0o600, name
        ports = listening_ports(server.proc.pid)
        ports.pop(server.port)  # the API: tokens
        scheduler_port = int(owner["address"].rsplit(":", 1)[1])
        assert scheduler_port in ports
        # scheduler, 2 nannies, 2 workers: no dashboard, no worker's HTTP server
        assert len(ports) == 5, ports
        # the stranger may reach the key's directory (a careless owner's world-searchable
        # state directory, made so here): the key's own mode must hold
        open_the_way(tls_dir.parent, top=base)
        tls = {"ca": str(tls_dir / "ca.pem"), "cert": str(tls_dir / "cert.pem"), "key": str(tls_dir / "key.pem")}
        with server.client(token) as c:
            assert c.get(f"/jobs/{running['id']}").json()["state"] == "running", "the job ended before the tries"
        # the stranger's own temporary directory (distributed writes a certificate held in
        # memory to a file there to load it), whatever the caller's TMPDIR lets it do
        scratch = base / "stranger-tmp"
        scratch.mkdir()
        os.chmod(scratch, 0o1777)
        out = subprocess.run([sys.executable, "-c", ATTEMPTS, json.dumps(sorted(ports)), owner["address"],
                              json.dumps(tls), str(user.pw_uid), str(user.pw_gid)],
                             capture_output=True, text=True, timeout=300, cwd=base,
                             env={**os.environ, "TMPDIR": str(scratch)})
        assert out.returncode == 0, out.stderr[-3000:]
        seen = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps({"listening": {p: ports[int(p)] for p in seen["ports"]}, **seen}, indent=1))
        assert seen["uid"] == user.pw_uid != 0 and seen["dropped"], seen
        for key in ("control_as_root", "control_as_stranger"):
            assert seen[key]["identity"].startswith("answered"), seen[key]
            assert seen[key]["run_on_scheduler"] == "ran as uid 0", seen[key]
        for port, tried in seen["ports"].items():
            for how, outcome in tried.items():
                assert outcome.startswith("refused"), (port, ports[int(port)], how, outcome)
                assert not outcome.endswith(NOT_A_REFUSAL), (port, how, outcome)
        for key in ("run_on_scheduler_tcp", "run_on_scheduler_own_certificate"):
            assert seen[key].startswith("refused") and not seen[key].endswith(NOT_A_REFUSAL), seen
        assert seen["key"] == "refused: PermissionError", seen
        # the owner gets in with the files its scheduler file names
        with owner_client(state["state_dir"]) as client:
            assert client.run_on_scheduler(os.getuid) == os.getuid()
        with server.client(token) as c:
            c.post(f"/jobs/{running['id']}/cancel")
    finally:
        server.stop()
