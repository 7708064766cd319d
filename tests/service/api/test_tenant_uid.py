"""Tenant B, a second local user, cannot read a store under tenant A's data directory
(issue 74), on PostgreSQL where its binaries are installed. Everything B does runs as
another uid (``spillway-stranger``), so that what keeps it out is the service's checks and
A's directory's mode, not the test's own rights: B tries A's store through the filesystem,
then, with its token, through every workflow and every input parameter, by A's path, by
links it plants in its own data directory (to the store, to A's directory), by ``..``,
by a store of its own whose every chunk is a link to A's, and by swapping its own store
for a link to A's just after each submission. Needs root (to switch uid); skipped
elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from serve_helpers import Server, add_tenant, open_the_way, postgres_if_installed, stranger, temp_dir_others_reach, \
    wait_state

from spillway import workflows
from spillway.workflows.inputs import RANDOM

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SHAPE, CHUNKS = (200, 200), (100, 100)
#: B's arrays are all ones, A's all sevens: a byte of A's read into a sum moves it
OWN_SUM = float(SHAPE[0] * SHAPE[1])
SWAPS = 4

#: B's side, as the other uid: it starts as root only to import (the interpreter and its
#: packages may be where that user cannot read), then drops to the uid for good
AS_B = r"""
import json, os, sys
import httpx
url, token, anns, ann_dir, bob_dir, uid, gid = sys.argv[1:8]
cases, swaps = json.loads(sys.argv[8]), int(sys.argv[9])
c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
assert c.get("/jobs").status_code == 200
os.setgroups([])
os.setgid(int(gid))
os.setuid(int(uid))
out = {"uid": os.getuid(), "fs": {}, "planted": {}, "submitted": [], "swapped": []}

def attempt(what, f):
    try:
        f()
        out["fs"][what] = "done"
    except OSError as e:
        out["fs"][what] = type(e).__name__

attempt("read A's store", lambda: open(os.path.join(anns, "zarr.json")).read())
attempt("list A's directory", lambda: os.listdir(ann_dir))
chunk = next(os.path.relpath(os.path.join(d, f), os.path.join(bob_dir, "mixed.zarr"))
             for d, _, fs in os.walk(os.path.join(bob_dir, "mixed.zarr")) for f in fs if f != "zarr.json")
attempt("hard-link A's chunk", lambda: os.link(os.path.join(anns, chunk), os.path.join(bob_dir, "stolen")))

# links of B's own making, in B's own directory
os.symlink(anns, os.path.join(bob_dir, "link.zarr"))
os.symlink(ann_dir, os.path.join(bob_dir, "dir-link"))
for d, _, fs in os.walk(os.path.join(bob_dir, "mixed.zarr")):  # every chunk a link to A's
    for f in fs:
        if f != "zarr.json":
            path = os.path.join(d, f)
            os.unlink(path)
            os.symlink(os.path.join(anns, os.path.relpath(path, os.path.join(bob_dir, "mixed.zarr"))), path)
            out["planted"][path] = os.readlink(path)
paths = [anns, os.path.join(bob_dir, "link.zarr"), os.path.join(bob_dir, "dir-link", "private.zarr"),
         os.path.join(bob_dir, "..", os.path.basename(ann_dir), "private.zarr"), os.path.join(bob_dir, "mixed.zarr")]
for workflow, param in cases:
    for path in paths:
        r = c.post("/jobs", json={"workflow": workflow, "params": {param: path}})
        out["submitted"].append({"workflow": workflow, "param": param, "path": path, "status": r.status_code,
                                 "body": r.json()})
# its own store, swapped for a link to A's just after each 201
for i in range(swaps):
    own = os.path.join(bob_dir, f"own-{i}.zarr")
    r = c.post("/jobs", json={"workflow": "reduction", "params": {"input": own, "op": "sum"}})
    os.rename(own, own + ".was")
    os.symlink(anns, own)
    out["swapped"].append({"status": r.status_code, "body": r.json()})
print(json.dumps(out))
"""


def store(path: Path, value: float) -> Path:
    import dask.array as da

    from spillway.workflows.zarr import write

    da.compute(write.store(da.full(SHAPE, value, chunks=CHUNKS), str(path)), scheduler="sync")
    return path


def chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for d, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(d, name), uid, gid)


def input_cases() -> list[tuple[str, str]]:
    """Every workflow's every parameter that names a store."""
    return [(name, p.name) for name in workflows.names() for p in workflows.get(name).params if p.default == RANDOM]


def test_tenant_b_as_another_uid_reads_nothing_under_tenant_a_data_directory(request):
    user = stranger()  # skips where not root
    root = temp_dir_others_reach("spillway-tenant-uid-").resolve()
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    ann_dir, bob_dir = root / "ann-data", root / "bob-data"
    ann_dir.mkdir(mode=0o700)
    bob_dir.mkdir(mode=0o700)
    anns = store(ann_dir / "private.zarr", 7.0)
    store(bob_dir / "mixed.zarr", 1.0)
    for i in range(SWAPS):
        store(bob_dir / f"own-{i}.zarr", 1.0)
    chown_tree(bob_dir, user.pw_uid, user.pw_gid)  # B's directory is B's own, to plant links in
    open_the_way(bob_dir, top=root.parent)
    assert os.stat(ann_dir).st_mode & 0o777 == 0o700 and os.stat(ann_dir).st_uid == os.getuid()
    state = {"state_dir": str(root / "state")}
    postgres_if_installed(request, state)
    add_tenant(state, "ann", "--data", str(ann_dir))
    bob = add_tenant(state, "bob", "--data", str(bob_dir), "--max-queued", "500")
    server = Server(state, "--cpu", "--n-workers", "2").start()
    try:
        cases = input_cases()
        assert len(cases) >= 12, cases
        out = subprocess.run([sys.executable, "-c", AS_B, server.url, bob, str(anns), str(ann_dir), str(bob_dir),
                              str(user.pw_uid), str(user.pw_gid), json.dumps(cases), str(SWAPS)],
                             capture_output=True, text=True, timeout=240, cwd=root)
        assert out.returncode == 0, out.stderr[-3000:]
        seen = json.loads(out.stdout)
        assert seen["uid"] == user.pw_uid != os.getuid()
        # the filesystem: A's directory is A's (the service's, 0700)
        assert seen["fs"] == {"read A's store": "PermissionError", "list A's directory": "PermissionError",
                              "hard-link A's chunk": "PermissionError"}, seen["fs"]
        assert seen["planted"] and all(target.startswith(str(anns)) for target in seen["planted"].values())
        admitted = []
        for s in seen["submitted"]:
            what = (s["workflow"], s["param"], s["path"])
            if s["status"] == 201:
                # only B's own store may pass the check at submission (its links are met when read)
                assert s["path"] == str(bob_dir / "mixed.zarr"), (what, s["body"])
                admitted.append(s["body"]["id"])
                continue
            assert s["status"] == 422, (what, s["body"])
            (error,) = s["body"]["detail"]
            msg = error["msg"]
            if s["path"] == str(bob_dir / "mixed.zarr"):
                # refused for what B's own metadata says (matmul's y of the wrong shape), naming
                # nothing of A's
                assert error["loc"][:2] == ["body", "params"] and "\n" not in msg, error
                assert str(ann_dir) not in msg, msg
            else:
                assert error["loc"] == ["body", "params", s["param"]], error
                # one line naming what B gave and B's own directories, nothing else
                assert msg == (f"{s['param']}: {s['path']!r} is outside this tenant's data directories "
                               f"({bob_dir})"), msg
        print(f"B as uid {user.pw_uid}: {len(seen['submitted'])} submissions over {len(cases)} workflow inputs, "
              f"{len(seen['submitted']) - len(admitted)} refused at once, {len(admitted)} admitted (its store of "
              "links to A's chunks)")
        with server.client(bob) as b:
            for job_id in admitted:
                # a store of links, checked again when the job starts (or met while read): the
                # job fails in one line naming B's store only
                end = wait_state(b, job_id, {"done", "failed", "cancelled"}, timeout=180)
                assert end["state"] == "failed", end
                error = end["error"]
                assert "\n" not in error and error.startswith("ParamError: "), error
                assert f"{str(bob_dir / 'mixed.zarr')!r} holds a link out of this tenant's data directories" in error \
                    or " is a link; " in error, error
                assert str(anns) not in error, error
            own = 0
            for s in seen["swapped"]:
                assert s["status"] in (201, 422), s
                if s["status"] == 422:  # the swap seen by the check at submission
                    assert s["body"]["detail"][0]["msg"].endswith(f"outside this tenant's data directories "
                                                                  f"({bob_dir})"), s
                    continue
                end = wait_state(b, s["body"]["id"], {"done", "failed", "cancelled"}, timeout=180)
                if end["state"] == "done":
                    checksum = b.get(f"/jobs/{end['id']}/result").json()["summary"]["checksum"]
                    assert checksum == OWN_SUM, (checksum, end)  # B's own ones, never A's sevens
                    own += 1
                else:
                    assert end["state"] == "failed" and "\n" not in end["error"], end
                    assert end["error"].startswith("ParamError: input: ") and str(anns) not in end["error"], end
            print(f"B's {SWAPS} stores swapped for links to A's after submission: {own} read B's own data, "
                  f"{SWAPS - own} refused or failed")
    finally:
        server.stop()
    # what B planted is still links, A's store untouched
    assert all(Path(p).is_symlink() for p in seen["planted"])
    assert (anns / "zarr.json").is_file() and not (bob_dir / "stolen").exists()
