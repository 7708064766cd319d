"""Tenants' files are private (issue 53), on PostgreSQL where its binaries are installed:
each tenant's outputs in a directory of its own, 0700 with files 0600, owned by the service
(another local user can neither list the results directory nor read a store whose path it
knows); an input is resolved and checked again when the job starts, so a link in a data
directory swapped after the submission to another tenant's output is refused, and so is a
store holding a link out of the data directories."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import (Server, add_tenant, open_the_way, postgres_if_installed, stranger, temp_dir_others_reach,
                           wait_state)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: what another local user tries: the script starts as root (the interpreter lives under
#: /root), drops to the user's uid for good, then lists and reads
ATTEMPTS = r"""
import json, os, sys
results, store, uid, gid = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
os.setgroups([])
os.setgid(gid)
os.setuid(uid)
out = {}
for what, attempt in (("list results", lambda: os.listdir(results)),
                      ("list tenant", lambda: os.listdir(os.path.dirname(store))),
                      ("read store", lambda: open(os.path.join(store, "zarr.json")).read())):
    try:
        attempt()
        out[what] = "done"
    except OSError as e:
        out[what] = type(e).__name__
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def service(request):
    # where another local user can pass (a private TMPDIR would refuse it for the test's
    # modes, not the service's); removed at the end
    root = temp_dir_others_reach("spillway-tenant-files-")
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    state = {"state_dir": str(root / "state")}
    data = root / "data"
    data.mkdir()
    postgres_if_installed(request, state)
    tokens = {"ann": add_tenant(state, "ann"), "bob": add_tenant(state, "bob", "--max-running", "1")}
    server = Server(state, "--cpu", "--n-workers", "2", "--data-dir", str(data)).start()
    try:
        yield server, tokens, data
    finally:
        server.stop()


def store(path: Path, seed: int) -> Path:
    import dask.array as da

    x = np.random.default_rng(seed).random((200, 200))
    da.to_zarr(da.from_array(x, chunks=(100, 100)), str(path), zarr_format=3)
    return path


def output_of_ann(server, tokens) -> tuple[str, str]:
    """A job of ann's with an output, done: (its id, its output as the result names it)."""
    with server.client(tokens["ann"]) as ann:
        job = ann.post("/jobs", json={"workflow": "slice", "params": {"size": "300x300", "chunks": "100x100"},
                                      "output": True}).json()
        assert wait_state(ann, job["id"], {"done", "failed"})["state"] == "done"
        return job["id"], ann.get(f"/jobs/{job['id']}/result").json()["output"]


def test_another_tenant_cannot_read_a_tenants_results_through_the_filesystem(service):
    server, tokens, _ = service
    job_id, output = output_of_ann(server, tokens)
    assert output == f"ann/{job_id}.zarr"
    results = Path(server.state["state_dir"]) / "results"
    stored = results / output
    assert stat.S_IMODE(results.stat().st_mode) == 0o711
    assert stat.S_IMODE((results / "ann").stat().st_mode) == 0o700
    for directory, dirs, files in os.walk(stored):
        for name in dirs:
            assert stat.S_IMODE(os.stat(os.path.join(directory, name)).st_mode) == 0o700, name
        for name in files:
            path = os.path.join(directory, name)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
            assert os.stat(path).st_uid == os.getuid()  # the service's
    user = stranger()
    open_the_way(results.parent, top=results.parents[1])
    out = subprocess.run([sys.executable, "-c", ATTEMPTS, str(results), str(stored), str(user.pw_uid),
                          str(user.pw_gid)], capture_output=True, text=True, timeout=60, cwd=results.parents[1])
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    print("another local user:", seen)
    assert seen == {"list results": "PermissionError", "list tenant": "PermissionError",
                    "read store": "PermissionError"}


def test_an_input_link_swapped_after_submission_is_refused_when_the_job_starts(service):
    server, tokens, data = service
    anns = Path(server.state["state_dir"]) / "results" / output_of_ann(server, tokens)[1]
    own = store(data / "bob-own.zarr", 1)
    link = data / "bob-input.zarr"
    link.symlink_to(own)
    with server.client(tokens["bob"]) as bob:
        # bob runs one job at a time: a long one first, so the next waits in the queue
        long = bob.post("/jobs", json={"workflow": "transpose-sum",
                                       "params": {"size": "3000x3000", "chunks": "100x100"}}).json()
        r = bob.post("/jobs", json={"workflow": "transpose-sum", "params": {"input": str(link)}})
        assert r.status_code == 201, r.text  # inside the data directory when submitted
        queued = r.json()
        assert bob.get(f"/jobs/{queued['id']}").json()["state"] == "queued"
        link.unlink()
        link.symlink_to(anns)  # now ann's output
        assert wait_state(bob, long["id"], {"done", "failed"}, timeout=120)["state"] == "done"
        end = wait_state(bob, queued["id"], {"done", "failed"}, timeout=120)
        assert end["state"] == "failed" and "outside this tenant's data directories" in end["error"], end
        # a store whose chunk directory is a link out of the data directories
        inner = store(data / "bob-inner.zarr", 2)
        chunks = inner / "c"
        os.rename(chunks, data / "elsewhere-c")
        chunks.symlink_to(anns / "c")
        r = bob.post("/jobs", json={"workflow": "transpose-sum", "params": {"input": str(inner)}})
        if r.status_code == 201:
            end = wait_state(bob, r.json()["id"], {"done", "failed"}, timeout=120)
            assert end["state"] == "failed" and "holds a link out of" in end["error"], end
        else:  # refused already (a reader of the store's metadata)
            assert r.status_code == 422, r.text
        # the plain case still runs
        link.unlink()
        link.symlink_to(own)
        r = bob.post("/jobs", json={"workflow": "transpose-sum", "params": {"input": str(link)}})
        assert wait_state(bob, r.json()["id"], {"done", "failed"}, timeout=120)["state"] == "done"
