"""No client stalls the API without a token (issue 53), on PostgreSQL where its binaries
are installed: slow request bodies from 20 addresses past the connection caps, slow
readers, endless header lines; six clients' 60,000-key bodies with a tenant's token, parsed
and refused (issue 74), and /healthz with no load beside them (the control); a guessed
token limited per address; every 429 with ``Retry-After``; a ``reduction`` job with verify
through the service.

The issue's target is ``/healthz`` under 0.5 s throughout: a timing, which
``benchmarks/service/latency.py`` measures (it runs these loads and compares their
figures with the target). Here every probe must be answered 200 within the liveness
deadline (``serve_helpers.LIVENESS_S``), and the figures are printed. The API's memory is checked against where it began once the
slow clients are cut: within 100 MiB."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import threading
import time

import httpx
import psutil
import pytest
from serve_helpers import (
    Server,
    add_tenant,
    free_port,
    postgres_if_installed,
    record_figures,
    slow_clients,
    wait_state,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HEADER_TIMEOUT_S = 3.0
#: how long the slow bodies are held (the service's --body-timeout, which cuts them) and how
#: many connect: short here, for CI; benchmarks/service/latency.py sets issue 63's round
#: (1,200 held for 40 s) through these variables
BODY_TIMEOUT_S = float(os.environ.get("SPILLWAY_STALLS_BODY_S", "4"))
SLOW_BODIES = int(os.environ.get("SPILLWAY_STALLS_BODIES", "1200"))
WRITE_TIMEOUT_S = 2.0
MIB = 2**20
SOURCES = [f"127.0.0.{i}" for i in range(2, 22)]  # 20 addresses


@pytest.fixture(scope="module")
def service(request, tmp_path_factory):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096 <= hard or (soft < 4096 and hard == resource.RLIM_INFINITY):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536,
                                                    hard))
    state = {"state_dir": str(tmp_path_factory.mktemp("stalls") / "state")}
    postgres_if_installed(request, state)
    tokens = {"ann": add_tenant(state, "ann"), "ops": add_tenant(state, "ops", "--admin"),
              "never": add_tenant(state, "never")}
    server = Server(state, "--cpu", "--n-workers", "2", "--header-timeout", str(HEADER_TIMEOUT_S),
                    "--body-timeout", str(BODY_TIMEOUT_S), "--write-timeout", str(WRITE_TIMEOUT_S)).start()
    try:
        with server.client(tokens["ann"]) as c:  # warm: the routes, the catalogue, the database pool
            for _ in range(20):
                c.get("/jobs")
                c.get("/openapi.json")
        yield server, tokens
    finally:
        server.stop()


def rss(server) -> int:
    return psutil.Process(server.proc.pid).memory_info().rss


#: the probe, in a process of its own so that the slow clients' event loop in this one does
#: not delay it (its figures are the service's, not this process's)
PROBE = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from serve_helpers import healthz_once
port, interval = int(sys.argv[2]), float(sys.argv[3])
while True:
    at = time.monotonic()
    took, status = healthz_once(port)
    print(at, took, status, flush=True)
    time.sleep(interval)
"""


class Probes:
    """``/healthz`` on a fresh connection every 50 ms (from another process), and the
    service's memory, while a load runs."""

    def __init__(self, server):
        self.server, self.times, self.statuses, self.peak = server, [], [], rss(server)
        self.started: list[float] = []  # when each probe began (time.monotonic, system-wide)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, rss(self.server))

    def __enter__(self):
        import subprocess
        import sys
        from pathlib import Path

        self._proc = subprocess.Popen([sys.executable, "-c", PROBE, str(Path(__file__).parent),
                                       str(self.server.port), "0.05"], stdout=subprocess.PIPE, text=True)
        self._first = self._proc.stdout.readline()  # probing before the load starts
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)
        self._proc.terminate()
        out, _ = self._proc.communicate(timeout=30)
        for line in [self._first.strip(), *out.splitlines()]:
            at, took, status = line.split(" ", 2)
            self.started.append(float(at))
            self.times.append(float(took))
            self.statuses.append(int(status) if status.isdigit() else status)

    def check(self, what: str, **extra) -> dict:
        """The figures, printed and recorded with ``extra`` and every probe's (start, ms)."""
        times = sorted(self.times)
        n = len(times)
        figures = {"probes": n, "p50_ms": round(times[n // 2] * 1e3, 1), "p90_ms": round(times[int(n * .9)] * 1e3, 1),
                   "max_ms": round(times[-1] * 1e3, 1), "statuses": sorted(set(map(str, self.statuses))), **extra}
        print(f"{what}: /healthz {json.dumps(figures)}")
        t0 = self.started[0] if self.started else 0.0
        record_figures(f"healthz during {what}", {
            **figures, "series_s_ms": [[round(at - t0, 3), round(took * 1e3, 1)]
                                       for at, took in zip(self.started, self.times)]})
        assert n >= 10, figures
        assert set(self.statuses) == {200}, f"/healthz not answered 200 during {what}: {figures}"
        return figures


def metric(server, admin_token: str, name: str) -> float:
    with server.client(admin_token) as admin:
        text = admin.get("/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


def settle(server, before: int, what: str, peak: int) -> int:
    """The service's memory once the slow clients are gone (it frees their buffers and hands
    the heap back within a couple of seconds)."""
    deadline = time.monotonic() + 15
    after = rss(server)
    while after - before > 100 * MIB and time.monotonic() < deadline:
        time.sleep(0.5)
        after = rss(server)
    print(f"{what}: API memory {before / MIB:.0f} MiB before, {peak / MIB:.0f} MiB at most, "
          f"{after / MIB:.0f} MiB after")
    assert after - before <= 100 * MIB, (before, peak, after)
    return after


def held_at(records: list[dict], moments: list[float]) -> list[int]:
    """How many of the slow connections the service held open at each of ``moments``."""
    return [sum(1 for r in records if "opened" in r and r["opened"] <= t < r.get("closed", float("inf")))
            for t in moments]


#: seconds of the control round (/healthz alone): what the machine gives without a load
CONTROL_S = float(os.environ.get("SPILLWAY_STALLS_CONTROL_S", "5"))


def test_healthz_with_no_load_the_control(service):
    """/healthz probed with nothing else sent: the figures of the machine and the probe
    themselves, beside which the loads' are read (a shared 2-core host shows its
    neighbours' load here)."""
    server, _ = service
    with Probes(server) as probes:
        time.sleep(CONTROL_S)
    probes.check(f"no load for {CONTROL_S:g} s (the control)",
                 backend="postgresql" if server.state.get("db") else "sqlite")


def test_slow_bodies_past_the_caps_leave_healthz_fast(service):
    """1,200 connections from 20 addresses (60 each, under the per-address cap of 64; 1,200
    in all, past the total of 1,024) each send a POST's headers at once and then its body one
    byte every 0.5 s, until the body deadline cuts them (``BODY_TIMEOUT_S``: 4 s here, 40 s
    in issue 63's round). Each bears a valid token: one without is answered 401 before its body
    is read (issue 74), so only a tenant can hold a body open."""
    server, tokens = service
    before = rss(server)
    first = (b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Authorization: Bearer " + tokens["ann"].encode() + b"\r\nContent-Length: 1000\r\n\r\n{")
    what = f"{SLOW_BODIES:,} slow bodies held {BODY_TIMEOUT_S:g} s"
    with Probes(server) as probes:
        records = asyncio.run(slow_clients(server.port, SOURCES, SLOW_BODIES, 0.5, BODY_TIMEOUT_S + 4, first=first,
                                           drip=b'"a": 1, ', batch=100, pace_s=0.1))
    connected = [r for r in records if "error" not in r]
    answers = {}
    for r in connected:
        answers[r.get("answer", "none")] = answers.get(r.get("answer", "none"), 0) + 1
    # held: sampled every 0.5 s from 0.5 s after the last connect (the evictions it caused
    # seen by their clients) to the first cut at the deadline
    start = max((r["opened"] for r in connected), default=0.0) + 0.5
    cuts = [r["closed"] for r in connected if r.get("answer", "").startswith("HTTP/1.1 408")]
    moments = [start + 0.5 * i for i in range(int(max(0.0, min(cuts, default=start) - start) / 0.5) + 1)]
    held = held_at(records, moments)
    # a 503 is the connection caps' (evicted or refused) or, before issue 74's tokens in
    # memory, a token lookup's that queued on the database's pool
    refused = [r.get("text", b"") for r in connected if r.get("answer", "").startswith("HTTP/1.1 503")]
    database = sum(1 for text in refused if b"job database" in text)
    caps = sum(1 for text in refused if b"too many connections" in text)
    probes.check(what, connected=len(connected), answers=answers, answers_503_database=database,
                 answers_503_connection_caps=caps,
                 held_min=min(held), held_max=max(held), held_for_s=round(moments[-1] - moments[0], 1),
                 backend="postgresql" if server.state.get("db") else "sqlite")
    print(f"{what}: {len(connected)} connected; answers {answers} (of the 503s {caps} the connection caps', "
          f"{database} the database's); "
          f"{min(held)}-{max(held)} held at once for {moments[-1] - moments[0]:.1f} s")
    assert len(connected) >= SLOW_BODIES * 5 // 6
    # every one ended by the service: refused or evicted (503) or past the body's deadline (408)
    assert all("closed" in r for r in connected), answers
    assert set(answers) <= {"HTTP/1.1 503 Service Unavailable", "HTTP/1.1 408 Request Timeout"}, answers
    # each bears a valid token, resolved from memory: none waits on the database (issue 74)
    assert database == 0, answers
    settle(server, before, what, probes.peak)


#: rounds of the six 60,000-key bodies (issue 74 measured four: /healthz max 142-252 ms)
BIG_BODY_ROUNDS = int(os.environ.get("SPILLWAY_STALLS_BIG_ROUNDS", "4"))


def test_six_60000_key_bodies_of_a_tenant_leave_healthz_fast(service):
    """Six clients with a valid token each send a 640 KB body of 60,000 unknown ``params``
    keys (``BIG_BODY_ROUNDS`` times, one after another): each passes the gate and is
    parsed, then refused (422) before validation. The parse is the API's CPU, not the
    event loop's: /healthz must be answered throughout."""
    server, tokens = service
    body = json.dumps({"workflow": "reduction", "params": {f"k{i:05d}": i for i in range(60_000)}}).encode()
    assert 600_000 < len(body) < 2**20
    answers: list[tuple[int, str, float]] = []

    def send():
        with server.client(tokens["ann"]) as c:
            for _ in range(BIG_BODY_ROUNDS):
                start = time.perf_counter()
                r = c.post("/jobs", content=body, headers={"Content-Type": "application/json"})
                answers.append((r.status_code, r.text[:200], time.perf_counter() - start))

    what = f"six 60,000-key bodies x {BIG_BODY_ROUNDS}"
    with Probes(server) as probes:
        began = time.monotonic()
        senders = [threading.Thread(target=send) for _ in range(6)]
        for t in senders:
            t.start()
        for t in senders:
            t.join(LIVENESS_S_BIG)
        # a load over in under a second (tokens decided from memory answer the 24 bodies
        # in about half of one) still gets the ten probes the figures are read from
        time.sleep(max(0.0, MIN_PROBE_S - (time.monotonic() - began)))
    took = sorted(t for _, _, t in answers)
    probes.check(what, bodies=len(answers), answer_p50_ms=round(took[len(took) // 2] * 1e3, 1),
                 answer_max_ms=round(took[-1] * 1e3, 1),
                 backend="postgresql" if server.state.get("db") else "sqlite")
    assert len(answers) == 6 * BIG_BODY_ROUNDS, answers
    for status, text, _ in answers:
        assert status == 422 and "params: 60000 keys, more than the 10 parameters of reduction" in text, text


#: a sender not done in this long is a stalled service (liveness, not latency)
LIVENESS_S_BIG = 120
#: seconds /healthz is probed at the least (every 50 ms: ten probes and more)
MIN_PROBE_S = 1.5


def test_slow_readers_are_cut_and_their_memory_given_back(service):
    """1,000 connections from 20 addresses each send 5 requests for the API's spec at once
    and read nothing (a 4 KiB receive buffer): the answers wait in the service's send buffer
    until ``--write-timeout`` drops the connection, which every one of them reaches."""
    server, tokens = service
    before = rss(server)
    first = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * 5
    with Probes(server) as probes:
        # 50 connections every 0.5 s: each asks for five answers (95 KB) that outgrow the
        # kernel's buffers (the service's 64 KiB, the reader's 8 KiB) and the service's 16 KiB
        records = asyncio.run(slow_clients(server.port, SOURCES, 1000, 0.5, WRITE_TIMEOUT_S + 4, first=first,
                                           reading=False, batch=50, pace_s=0.5))
    probes.check("1,000 slow readers")
    connected = [r for r in records if "error" not in r]
    print(f"1,000 slow readers: {len(connected)} connected")
    assert len(connected) >= 950
    # every one reached the write deadline and was dropped (a reset: what it did not read is gone)
    assert metric(server, tokens["ops"], "spillway_http_write_timeouts_total") >= len(connected)
    settle(server, before, "1,000 slow readers", probes.peak)


async def endless_header(port: int, source: str, seconds: float) -> dict:
    """A request whose one header line never ends, sent as fast as the service reads it."""
    out = {"sent": 0}
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    start = time.monotonic()
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        while time.monotonic() - start < seconds:
            writer.write(b"a" * 65536)
            await writer.drain()
            out["sent"] += 65536
    except (ConnectionError, OSError) as e:
        out["error"] = type(e).__name__
    try:
        out["answer"] = (await asyncio.wait_for(reader.readline(), 2)).decode("latin1").strip()
    except (ConnectionError, OSError, TimeoutError) as e:
        out.setdefault("error", type(e).__name__)
    out["s"] = round(time.monotonic() - start, 2)
    writer.close()
    return out


def test_endless_header_lines_are_cut_at_the_size_limit(service):
    server, tokens = service
    before = rss(server)

    async def one_after_another(seconds: float) -> list[dict]:
        end, out = time.monotonic() + seconds, []
        while time.monotonic() < end:
            out.append(await endless_header(server.port, "127.0.0.30", 8))
        return out

    async def sixteen():
        # 16 at a time from one address, each starting another as soon as it is cut, for 6 s
        return [r for rs in await asyncio.gather(*(one_after_another(6) for _ in range(16))) for r in rs]

    with Probes(server) as probes:
        results = asyncio.run(sixteen())
    probes.check("16 endless header lines")
    sent = sorted(r["sent"] for r in results)
    print(f"16 endless header lines: {len(results)} requests, each cut after {sent[0]}-{sent[-1]} bytes "
          f"written (the client's buffers included), {max(r['s'] for r in results)} s at most")
    for r in results:
        # cut after 32 KiB (the default --max-header-bytes) with 431, or reset with it unread
        assert r["sent"] < 16 * 2**20 and r["s"] < 8, r
        assert r.get("answer", "").startswith("HTTP/1.1 431") or r.get("error"), r
    # the 431 is written, but the client's unread bytes make the close a reset that drops it:
    # the service's count says what it did
    assert metric(server, tokens["ops"], "spillway_http_headers_too_large_total") >= len(results)
    settle(server, before, "16 endless header lines", probes.peak)


def test_guessed_tokens_are_limited_per_address_with_retry_after(service):
    server, tokens = service
    guesser = f"127.0.0.{40 + free_port() % 100}"  # an address no other test uses
    transport = httpx.HTTPTransport(local_address=guesser)
    statuses, retry = [], []
    with httpx.Client(base_url=server.url, transport=transport, timeout=30,
                      headers={"Authorization": "Bearer " + "0" * 64}) as c:
        for _ in range(40):
            r = c.get("/jobs")
            statuses.append(r.status_code)
            if r.status_code == 429:
                retry.append(int(r.headers["retry-after"]))
        # the address is held back for tokens that are no live one; a valid tenant there is
        # served, seen since the start or not (issues 63 and 74: a shared address)
        r = c.get("/jobs", headers={"Authorization": "Bearer spw_" + "1" * 43})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
        for name in ("never", "ann"):
            r = c.get("/jobs", headers={"Authorization": f"Bearer {tokens[name]}"})
            assert r.status_code == 200, (name, r.text)
    assert statuses[:30] == [401] * 30 and statuses[30:] == [429] * 10, statuses
    assert all(1 <= s <= 60 for s in retry), retry
    # another address is not
    with server.client(tokens["ann"]) as c:
        assert c.get("/jobs").status_code == 200


def test_a_reduction_verify_job_passes_through_the_service(service):
    """issue 53: every `reduction` job with verify failed in the service (its parameters did
    not survive the reference's child process); the same job passed in `spillway run`."""
    server, tokens = service
    with server.client(tokens["ann"]) as c:
        for op in ("sum", "std"):
            r = c.post("/jobs", json={"workflow": "reduction", "verify": True,
                                      "params": {"size": "600x600", "chunks": "200x200", "op": op}})
            assert r.status_code == 201, r.text
            done = wait_state(c, r.json()["id"], {"done", "failed"}, timeout=120)
            assert done["state"] == "done", done
            report = c.get(f"/jobs/{done['id']}/result").json()["report"]
            assert report["verify"]["ok"] is True, report["verify"]
