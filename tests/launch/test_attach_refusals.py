"""Attaching to an address whose listener is not a dask scheduler fails in one line within
the attach timeout: a closed port (said at once: distributed retried the refusal for the
whole timeout), a web server (which answers nothing until it has a request line, or closes
on the client's binary handshake; asked over HTTP once it has been silent a second), a
server that sends junk (which distributed's decoder took for frames of exabytes), and one
that accepts and says nothing. The bound is the probe's own (its message names it); the
tests hold the waits to liveness deadlines only, and print how long each refusal took."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

import spillway
from spillway.options.errors import OptionsError
from spillway.launch import attach
from spillway.launch.attach import ATTACH_TIMEOUT_S
from spillway.launch.session import connect_client
from spillway.options.settings import Options

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def listener(serve):
    """A loopback listener whose connections ``serve(conn)`` handles, each in a thread."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        s.settimeout(0.2)
        stop = threading.Event()

        def accept():
            while not stop.is_set():
                try:
                    conn, _ = s.accept()
                except OSError:
                    continue
                threading.Thread(target=serve, args=(conn, stop), daemon=True).start()

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            yield f"tcp://127.0.0.1:{s.getsockname()[1]}"
        finally:
            stop.set()
            thread.join(5)


def junk(conn, stop):
    with conn:
        conn.sendall(b"\xff" * 4096)  # eight bytes of it read as a count of frames
        stop.wait(30)


def silent(conn, stop):
    with conn:
        stop.wait(30)


def test_a_server_that_sends_junk_is_not_a_scheduler():
    with listener(junk) as address:
        started = time.monotonic()
        with pytest.raises(OptionsError) as refused:
            connect_client(Options.resolve(scheduler_address=address))
    line = str(refused.value)
    assert line.startswith(f"scheduler-address: {address!r} is not a dask scheduler") and "\n" not in line, line
    print(f"junk refused in {time.monotonic() - started:.1f} s")


def test_a_listener_that_says_nothing_is_refused_at_the_timeout():
    with listener(silent) as address:
        started = time.monotonic()
        with pytest.raises(OptionsError) as refused:
            attach.refuse_non_scheduler(f"scheduler-address: {address!r}", address, None, timeout=2)
    line = str(refused.value)
    assert "did not answer as a dask scheduler within 2 s" in line and "\n" not in line, line
    print(f"silence refused in {time.monotonic() - started:.1f} s")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once it is closed


def test_a_closed_port_is_refused_at_once_naming_the_address():
    address = f"tcp://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    with pytest.raises(OptionsError) as refused:
        connect_client(Options.resolve(scheduler_address=address))
    line = str(refused.value)
    assert line.startswith(f"scheduler-address: {address!r} refused the connection: nothing listens") \
        and "\n" not in line, line
    print(f"a closed port refused in {time.monotonic() - started:.2f} s (the attach timeout: {ATTACH_TIMEOUT_S} s)")


def test_an_address_without_a_scheme_is_probed_as_tcp():
    address = f"127.0.0.1:{closed_port()}"
    with pytest.raises(OptionsError, match="refused the connection"):
        connect_client(Options.resolve(scheduler_address=address))


def test_local_attaching_to_a_closed_port_is_refused_before_anything_starts():
    address = f"tcp://127.0.0.1:{closed_port()}"
    with pytest.raises(OptionsError, match=f"scheduler-address: '{address}' refused the connection"):
        spillway.local(scheduler_address=address)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_run_attaching_to_a_closed_port_says_so_in_one_line(tmp_path):
    address = f"tcp://127.0.0.1:{closed_port()}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "spillway", "run", "transpose-sum", "--scheduler-address", address],
                          capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path)
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines() == [f"spillway: error: scheduler-address: {address!r} refused the connection: "
                                        f"nothing listens on port {address.rsplit(':', 1)[1]} of 127.0.0.1 "
                                        "(`spillway up` starts a cluster there)"], done.stderr
    print(f"a closed port refused by the CLI in {took:.1f} s (the attach timeout: {ATTACH_TIMEOUT_S} s)")


@pytest.fixture
def web_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_web_server_is_asked_over_http_and_named_before_the_timeout(web_server):
    started = time.monotonic()
    with pytest.raises(OptionsError) as refused:
        connect_client(Options.resolve(scheduler_address=web_server))
    line = str(refused.value)
    assert line.startswith(f"scheduler-address: {web_server!r} is not a dask scheduler: it answers HTTP (HTTP/1.") \
        and "\n" not in line, line
    print(f"a web server refused in {time.monotonic() - started:.2f} s (the attach timeout: {ATTACH_TIMEOUT_S} s)")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_web_servers_address_is_one_line_within_the_attach_timeout(web_server, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "spillway", "run", "transpose-sum", "--scheduler-address", web_server],
                          capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path)
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"spillway: error: scheduler-address: {web_server!r}"), done.stderr
    assert "dask scheduler" in lines[0], lines[0]
    print(f"a web server's address refused in {took:.1f} s (the attach timeout: {ATTACH_TIMEOUT_S} s)")
