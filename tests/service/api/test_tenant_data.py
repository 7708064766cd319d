"""Data per tenant (issue 74), on PostgreSQL where its binaries are installed: a tenant
given data directories (`spillway tenant add NAME --data DIR`) reads stores there and
nowhere else, through every workflow and every input parameter; a tenant given none reads
under the service's `--data-dir` (said in one line at start); a refusal names the tenant's
own directories only. A chunk with a second hard link (to another tenant's chunk) fails
its job in one line."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from serve_helpers import Server, add_tenant, postgres_if_installed, spillway, state_args, wait_state

from spillway import workflows
from spillway.service.api.auth import MAX_AGE_S
from spillway.workflows.inputs import RANDOM

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SHAPE, CHUNKS = (200, 200), (100, 100)


def store(path: Path, value: float) -> Path:
    import dask.array as da

    from spillway.workflows.zarr import write

    da.compute(write.store(da.full(SHAPE, value, chunks=CHUNKS), str(path)), scheduler="sync")
    return path


def test_each_tenant_reads_only_its_own_data_directories(request, tmp_path):
    state = {"state_dir": str(tmp_path / "state")}
    postgres_if_installed(request, state)
    dirs = {name: tmp_path / name for name in ("ann-data", "bob-data", "shared")}
    for d in dirs.values():
        d.mkdir(mode=0o700)
    ann = add_tenant(state, "ann", "--data", str(dirs["ann-data"]))
    bob = add_tenant(state, "bob", "--data", str(dirs["bob-data"]), "--max-queued", "500")
    cat = add_tenant(state, "cat")  # the service's --data-dir
    anns = store(dirs["ann-data"] / "private.zarr", 7.0)
    bobs = store(dirs["bob-data"] / "own.zarr", 1.0)
    shared = store(dirs["shared"] / "shared.zarr", 3.0)
    # a link in bob's directory to ann's store: followed, it leads out of bob's directories
    os.symlink(anns, dirs["bob-data"] / "link.zarr")
    server = Server(state, "--cpu", "--n-workers", "1", "--data-dir", str(dirs["shared"])).start()
    try:
        log = server.log.read_text()
        assert (f"tenants without data directories of their own read inputs under {dirs['shared']} (--data-dir); "
                "2 tenant(s) have their own") in log, log
        with server.client(bob) as b:
            refused = 0
            for name in workflows.names():
                for p in workflows.get(name).params:
                    if p.default != RANDOM:
                        continue
                    for path in (anns, dirs["bob-data"] / "link.zarr", shared):
                        r = b.post("/jobs", json={"workflow": name, "params": {p.name: str(path)}})
                        assert r.status_code == 422, (name, p.name, r.text)
                        (error,) = r.json()["detail"]
                        assert error["loc"] == ["body", "params", p.name], error
                        msg = error["msg"]
                        assert "\n" not in msg and msg == (f"{p.name}: {str(path)!r} is outside this tenant's data "
                                                           f"directories ({dirs['bob-data']})"), msg
                        refused += 1
            assert refused >= 3 * 12
            r = b.post("/jobs", json={"workflow": "reduction", "params": {"input": str(bobs), "op": "sum"}})
            assert r.status_code == 201, r.text
            end = wait_state(b, r.json()["id"], {"done", "failed"}, timeout=120)
            assert end["state"] == "done", end
            assert b.get(f"/jobs/{end['id']}/result").json()["summary"]["checksum"] == SHAPE[0] * SHAPE[1]
        with server.client(ann) as a:
            r = a.post("/jobs", json={"workflow": "reduction", "params": {"input": str(anns), "op": "sum"}})
            assert r.status_code == 201, r.text
            end = wait_state(a, r.json()["id"], {"done", "failed"}, timeout=120)
            assert a.get(f"/jobs/{end['id']}/result").json()["summary"]["checksum"] == 7.0 * SHAPE[0] * SHAPE[1]
        with server.client(cat) as c:
            r = c.post("/jobs", json={"workflow": "reduction", "params": {"input": str(shared), "op": "sum"}})
            assert r.status_code == 201, r.text
            assert wait_state(c, r.json()["id"], {"done", "failed"}, timeout=120)["state"] == "done"
            r = c.post("/jobs", json={"workflow": "reduction", "params": {"input": str(anns), "op": "sum"}})
            assert r.status_code == 422
            assert r.json()["detail"][0]["msg"].endswith(f"outside this tenant's data directories ({dirs['shared']})")
        # a job checked against bob's directories, which change before it starts: checked again then
        out = spillway("tenant", "set", "bob", "--data", str(dirs["shared"]), *state_args(state))
        assert out.returncode == 0 and f"data={dirs['shared']}" in out.stdout, out.stderr
        time.sleep(MAX_AGE_S)  # the service sees a tenant's change within this (issue 74: tokens in memory)
        with server.client(bob) as b:
            r = b.post("/jobs", json={"workflow": "reduction", "params": {"input": str(bobs), "op": "sum"}})
            assert r.status_code == 422, r.text
    finally:
        server.stop()


def test_a_chunk_with_a_second_hard_link_fails_its_job(request, tmp_path):
    state = {"state_dir": str(tmp_path / "state")}
    postgres_if_installed(request, state)
    ann_dir, bob_dir = tmp_path / "ann-data", tmp_path / "bob-data"
    ann_dir.mkdir()
    bob_dir.mkdir()
    add_tenant(state, "ann", "--data", str(ann_dir))
    bob = add_tenant(state, "bob", "--data", str(bob_dir))
    anns = store(ann_dir / "private.zarr", 7.0)
    bobs = store(bob_dir / "own.zarr", 1.0)
    chunk = next(p for p in sorted(bobs.rglob("*")) if p.is_file() and p.name != "zarr.json")
    theirs = anns / chunk.relative_to(bobs)
    chunk.unlink()
    os.link(theirs, chunk)  # bob's chunk now the very file of ann's
    server = Server(state, "--cpu", "--n-workers", "1").start()
    try:
        with server.client(bob) as b:
            r = b.post("/jobs", json={"workflow": "reduction", "params": {"input": str(bobs), "op": "sum"}})
            assert r.status_code == 201, r.text
            end = wait_state(b, r.json()["id"], {"done", "failed"}, timeout=120)
            assert end["state"] == "failed", end
            error = end["error"]
            assert "\n" not in error and error.startswith("ParamError: input: "), error
            assert "2 hard links" in error and str(anns) not in error, error
    finally:
        server.stop()


def test_open_key_refuses_a_chunk_with_two_links(tmp_path):
    from spillway.options.errors import ParamError
    from spillway.workflows.zarr.pinned import open_key, pin_of

    root = tmp_path / "s.zarr"
    (root / "c").mkdir(parents=True)
    (root / "c" / "0").write_bytes(b"mine")
    pin = pin_of(str(root))
    fd = open_key(pin, "c/0")
    assert fd is not None
    os.close(fd)
    os.link(root / "c" / "0", tmp_path / "elsewhere")
    with pytest.raises(ParamError, match=r"^input: 'c/0' in .* has 2 hard links \(at most 1\); nothing of it was read$"):
        open_key(pin, "c/0")


def test_tenant_data_directories_from_the_command_line(tmp_path):
    state = {"state_dir": str(tmp_path / "state")}
    data = tmp_path / "d"
    data.mkdir()
    out = spillway("tenant", "add", "ann", "--data", str(tmp_path / "missing"), *state_args(state))
    assert out.returncode != 0
    assert "'--data': Directory" in out.stderr and "does not exist" in out.stderr, out.stderr
    add_tenant(state, "ann", "--data", str(data), "--data", str(data))
    import json

    listed = json.loads(spillway("tenant", "list", "--json", *state_args(state)).stdout)
    assert listed[0]["data_dirs"] == [str(data.resolve())]
    out = spillway("tenant", "set", "ann", "--default-data", *state_args(state))
    assert out.returncode == 0 and "data=the service's --data-dir" in out.stdout, out.stdout + out.stderr
    listed = json.loads(spillway("tenant", "list", "--json", *state_args(state)).stdout)
    assert listed[0]["data_dirs"] is None
