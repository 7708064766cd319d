"""The store-swap race (issue 63), on PostgreSQL where its binaries are installed: a tenant
submits a `reduction` of a store in a data directory, then, at a delay from 0 to 2 s after
the 201, replaces that store with a link to another tenant's private store. The job
pins its input when checked and reads through the directory pinned, so it never reads a
byte of the other store: it fails in one line naming the input, or ends done with the
sum of its own array, exactly. 50 jobs, the delays spread over 0..2 s."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from serve_helpers import Server, add_tenant, postgres_if_installed, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RACES = 50
SHAPE, CHUNKS = (400, 400), (50, 50)
#: bob's arrays are all ones: any chunk of ann's (sevens) read instead moves the sum
OWN_SUM = float(SHAPE[0] * SHAPE[1])


def store(path: Path, value: float) -> Path:
    import dask.array as da

    from spillway.workflows.zarr import write

    da.compute(write.store(da.full(SHAPE, value, chunks=CHUNKS), str(path)), scheduler="sync")
    return path


def test_a_store_swapped_for_a_link_while_its_job_runs_reads_nothing_of_the_other(request, tmp_path):
    state = {"state_dir": str(tmp_path / "state")}
    data = tmp_path / "data"
    data.mkdir()
    postgres_if_installed(request, state)
    add_tenant(state, "ann")
    bob = add_tenant(state, "bob", "--max-running", "8", "--max-queued", "200")
    server = Server(state, "--cpu", "--n-workers", "2", "--threads-per-worker", "2", "--data-dir", str(data))
    server.start()
    try:
        # ann's private output, where the service keeps it
        theirs = Path(state["state_dir"]) / "results" / "ann"
        theirs.mkdir(mode=0o700, parents=True, exist_ok=True)
        anns = store(theirs / "private.zarr", 7.0)
        inputs = [store(data / f"bob-{i}.zarr", 1.0) for i in range(RACES)]
        delays = [2.0 * i / (RACES - 1) for i in range(RACES)]
        jobs: list[str] = []
        swaps: list[threading.Thread] = []

        def swap(path: Path, delay: float):
            time.sleep(delay)
            os.rename(path, path.with_suffix(".was"))
            os.symlink(anns, path)

        with server.client(bob) as c:
            for path, delay in zip(inputs, delays):
                r = c.post("/jobs", json={"workflow": "reduction", "params": {"input": str(path), "op": "sum"}})
                assert r.status_code == 201, r.text
                jobs.append(r.json()["id"])
                t = threading.Thread(target=swap, args=(path, delay))
                t.start()
                swaps.append(t)
            for t in swaps:
                t.join(10)
            outcomes = {"done": 0, "failed": 0}
            for job_id, delay in zip(jobs, delays):
                end = wait_state(c, job_id, {"done", "failed", "cancelled"}, timeout=240)
                outcomes[end["state"]] = outcomes.get(end["state"], 0) + 1
                if end["state"] == "done":
                    checksum = c.get(f"/jobs/{job_id}/result").json()["summary"]["checksum"]
                    assert checksum == OWN_SUM, (delay, checksum, end)
                else:
                    assert end["state"] == "failed", end
                    error = end["error"]
                    assert "\n" not in error and error.startswith("ParamError: input: "), (delay, error)
                    assert str(anns) not in error, error  # the other store is not even named
        print(f"{RACES} swaps over 0..2 s: {outcomes}")
        assert sum(outcomes.values()) == RACES
    finally:
        server.stop()
