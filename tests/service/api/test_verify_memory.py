"""A verify job's NumPy reference is built off the API process (issue 45: one 16000x16000
job took the serve process from 432 MiB to 4.3 GiB, three at once to 8.6 GiB): against a
real `spillway serve` (PostgreSQL where installed), three verify jobs at once leave the
serve process's resident memory within 200 MiB of where it was, and each is checked.

SPILLWAY_VERIFY_SIDE sets the jobs' side (default 5000: 200 MB inputs, whose references in
the serve process would take it past the bound; the issue's figure is 16000)."""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest
from serve_helpers import Server, add_tenant, postgres_if_installed, wait_state

SIDE = int(os.environ.get("SPILLWAY_VERIFY_SIDE", "5000"))
MiB = 2**20


@pytest.fixture(scope="module")
def service(request, tmp_path_factory):
    state = postgres_if_installed(request, {"state_dir": str(tmp_path_factory.mktemp("verify") / "state")})
    token = add_tenant(state, "vera", "--max-running", "3")
    server = Server(state, "--cpu", "--n-workers", "2").start()
    try:
        yield server, token
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_three_verify_jobs_leave_the_serve_process_flat(service):
    server, token = service
    proc = psutil.Process(server.proc.pid)
    chunks = f"{max(500, SIDE // 8)}x{max(500, SIDE // 8)}"
    with server.client(token) as c:
        # a first small verify job loads what any job loads (the reference's machinery included)
        first = c.post("/jobs", json={"workflow": "transpose-sum", "verify": True,
                                      "params": {"size": "1000x1000", "chunks": "500x500"}}).json()
        assert wait_state(c, first["id"], "done", timeout=120)
        time.sleep(1)
        before = proc.memory_info().rss
        peak = [before]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                try:
                    peak[0] = max(peak[0], proc.memory_info().rss)
                except psutil.Error:
                    return
                time.sleep(0.1)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            ids = []
            for seed in (1, 2, 3):
                r = c.post("/jobs", json={"workflow": "transpose-sum", "verify": True,
                                          "params": {"size": f"{SIDE}x{SIDE}", "chunks": chunks, "seed": seed}})
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])
            ends = [wait_state(c, i, {"done", "failed"}, timeout=840) for i in ids]
        finally:
            stop.set()
            sampler.join()
        for end in ends:
            assert end["state"] == "done", end
            verify = c.get(f"/jobs/{end['id']}/result").json()["report"]["verify"]
            assert verify["ok"] is True and verify["reference_process"] is True, verify
        peaks = [c.get(f"/jobs/{i}/result").json()["report"]["verify"]["reference_peak_bytes"] for i in ids]
    grew = peak[0] - before
    print(f"3 verify jobs of {SIDE}x{SIDE}: serve RSS {before / MiB:.0f} MiB before, peak {peak[0] / MiB:.0f} MiB "
          f"(+{grew / MiB:.0f} MiB); the references' own processes peaked at "
          f"{', '.join(f'{p / MiB:.0f}' for p in peaks)} MiB")
    assert grew < 200 * MiB, grew
