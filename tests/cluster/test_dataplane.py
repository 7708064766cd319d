"""The data plane (spillway.cluster.dataplane): its wire on its own, the hook's routing with
stand-in planes, and real workers moving chunks over UCXX (UCX's TCP transport here; CUDA
IPC between GPUs on the GPU hosts: tests/cluster/test_dataplane_gpu.py and the bench)."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest

from spillway.cluster.dataplane import hook, wire


# --- the wire, no UCXX


@pytest.mark.parametrize("value", [
    np.arange(12, dtype=np.float64).reshape(3, 4),
    np.arange(5, dtype=np.int32),
    np.float64(2.5),
    np.arange(12.0).reshape(3, 4).T,  # not C-contiguous: serialized as distributed does
    ("a", 1, np.ones(3)),
    {"x": [1, 2]},
    None,
    "text",
])
def test_values_cross_the_wire_unchanged(value):
    reply, frames, into = wire.describe_reply({("x", 0, 1): value, "y": value})
    assert into == {} and reply["slot"] == [-1, -1]
    message = wire.unpack(wire.pack(reply))
    assert [n for _, n in message["frames"]] == [wire.frame_bytes(f) for f in frames]
    # the receiver's frames are fresh buffers, filled with the bytes sent
    received = [np.frombuffer(bytes(memoryview(f).cast("B")), dtype=np.uint8).copy() for f in frames]
    got = wire.values_of(message, received)
    assert set(got) == {("x", 0, 1), "y"}
    for v in got.values():
        if isinstance(value, np.ndarray):
            assert v.dtype == value.dtype and v.shape == value.shape and np.array_equal(v, value)
        elif isinstance(value, tuple):
            assert v[:2] == value[:2] and np.array_equal(v[2], value[2])
        else:
            assert v == value


def test_a_value_that_fits_its_slot_goes_there_and_the_rest_after_the_slots():
    a, b = np.arange(16.0), np.arange(6.0).reshape(2, 3).T  # b is not contiguous: not one frame
    keys = ["a", "b", "gone", "c"]
    slots = [[False, a.nbytes], [False, 48], [False, 8], [False, 999]]  # c's guess is wrong
    c = np.arange(4, dtype=np.int32)
    reply, frames, into = wire.describe_reply({"a": a, "b": b, "c": c}, slots, keys)
    assert reply["slot"] == [0, -1, -1] and into == {0: a}
    assert sum(reply["count"][1:]) == len(frames)  # b's and c's frames go after the slots
    message = wire.unpack(wire.pack(reply))
    got = wire.values_of(message, [np.frombuffer(bytes(memoryview(f).cast("B")), np.uint8).copy() for f in frames],
                         [np.frombuffer(a.tobytes(), np.uint8).copy(), None, None, None])
    assert set(got) == {"a", "b", "c"}  # a key the sender no longer holds is left out
    assert np.array_equal(got["a"], a) and np.array_equal(got["b"], b) and np.array_equal(got["c"], c)
    # slots and frames never share a tag
    assert wire.slot_tag(7, 3) == wire.tag(7, 4) and wire.frame_tag(7, 4, 0) == wire.tag(7, 5)


def test_a_contiguous_array_is_its_own_frame_and_anything_else_is_serialized():
    a = np.arange(8.0)
    assert wire.to_frames(a) == ("array", ["numpy", "<f8", [8]], [a])
    assert wire.to_frames(a)[2][0] is a  # no copy
    kind, head, frames = wire.to_frames(a[::2])
    assert kind == "dumps" and head is None and frames


def test_control_messages_and_tags_have_limits():
    with pytest.raises(wire.TooLarge, match="control message of"):
        wire.pack({"keys": ["k" * 100] * 1000})
    assert wire.tag(3, 0) != wire.tag(2, wire.FRAMES_PER_ID - 1)
    assert len({wire.tag(i, j) for i in range(1, 4) for j in range(3)}) == 9
    with pytest.raises(wire.TooLarge):
        wire.tag(1, wire.FRAMES_PER_ID)


# --- the hook, with stand-in planes


class StandIn:
    def __init__(self, reaches=True, response=None, fail=None):
        self._reaches, self.response, self.fail, self.asked = reaches, response, fail, []

    async def reaches(self, peer):
        return self._reaches

    async def fetch(self, peer, keys):
        self.asked.append((peer, list(keys)))
        if self.fail:
            raise self.fail
        return self.response


@pytest.fixture
def original(monkeypatch):
    calls = []

    async def comm_path(rpc, keys, worker, *, who=None, serializers=None, deserializers=None):
        calls.append((worker, list(keys), who))
        return {"status": "OK", "data": {k: "comm" for k in keys}}

    monkeypatch.setattr(hook, "_original", comm_path)
    monkeypatch.setattr(hook, "PLANES", {})
    return calls


def route(keys, worker="ucx://peer:1", who="ucx://me:2"):
    return asyncio.run(hook.routed_get_data_from_worker(None, keys, worker, who=who))


def test_a_gather_goes_over_the_plane_where_both_ends_have_one(original):
    plane = hook.PLANES["ucx://me:2"] = StandIn(response={"status": "OK", "data": {"k": "plane"}})
    assert route(["k"]) == {"status": "OK", "data": {"k": "plane"}}
    assert plane.asked == [("ucx://peer:1", ["k"])] and original == []


def test_the_comm_path_for_a_peer_or_worker_without_a_plane_or_a_request_too_large(original):
    assert route(["k"])["data"] == {"k": "comm"}  # this worker has no plane
    hook.PLANES["ucx://me:2"] = StandIn(reaches=False)
    assert route(["k"])["data"] == {"k": "comm"}  # the peer has none
    hook.PLANES["ucx://me:2"] = StandIn(response=None)  # the plane declined (too many keys)
    assert route(["k"])["data"] == {"k": "comm"}
    assert len(original) == 3


def test_busy_and_a_lost_peer_reach_distributed_as_its_own_comm_says_them(original):
    hook.PLANES["ucx://me:2"] = StandIn(response={"status": "busy"})
    assert route(["k"]) == {"status": "busy"}
    from distributed.comm.core import CommClosedError

    hook.PLANES["ucx://me:2"] = StandIn(fail=CommClosedError("data plane: lost ucx://peer:1"))
    with pytest.raises(OSError, match="lost"):  # gather_dep's network failure: the peer is dead
        route(["k"])
    assert original == []


def test_install_and_uninstall_swap_distributeds_function_once(monkeypatch):
    import distributed.worker

    before = distributed.worker.get_data_from_worker
    monkeypatch.setattr(hook, "_original", None)
    monkeypatch.setattr(hook, "PLANES", {"w": object()})
    hook.install()
    hook.install()
    assert distributed.worker.get_data_from_worker is hook.routed_get_data_from_worker
    assert hook._original is before
    hook.uninstall()  # a plane is left: stays
    assert distributed.worker.get_data_from_worker is hook.routed_get_data_from_worker
    hook.PLANES.clear()
    hook.uninstall()
    assert distributed.worker.get_data_from_worker is before


# --- real workers over UCXX (its TCP transport on a machine without GPUs)


def make(n, seed):
    return np.random.default_rng(seed).integers(0, 2**62, n // 8, dtype=np.int64)


def same(received, n, seed):
    return bool(np.array_equal(received, make(n, seed)))


def pair(n, seed):
    return ("meta", make(n, seed), {"n": n})


def pair_same(received, n, seed):
    return received[0] == "meta" and received[2] == {"n": n} and same(received[1], n, seed)


def incoming(dask_worker=None):
    return [(e["who"], sorted(map(str, e["keys"]))) for e in dask_worker.transfer_incoming_log]


def test_a_message_counts_only_with_the_clusters_secret():
    assert wire.authentic(wire.unpack(wire.pack(wire.signed({"id": 1}, "s3cret"))), "s3cret")
    assert not wire.authentic({"id": 1}, "s3cret")
    assert not wire.authentic(wire.signed({"id": 1}, "other"), "s3cret")
    assert not wire.authentic({"id": 1, wire.SECRET_FIELD: 7}, "s3cret")
    assert not wire.authentic([1], "s3cret")
    # a plane without a secret answers nobody
    assert not wire.authentic(wire.signed({"id": 1}, ""), "")


#: a process that is not one of the cluster's workers asks a plane for a key it knows the
#: name of (a local user finds the port in /proc/net/tcp)
STRANGER = """
import asyncio, sys
import ucxx
from spillway.cluster.dataplane import wire

async def main(host, port, key):
    endpoint = await ucxx.create_endpoint(host, int(port))
    await endpoint.send(wire.pack({"id": 1, "keys": [key], "slots": [None]}))
    buffer = wire.control_buffer()
    try:
        await asyncio.wait_for(endpoint.recv(buffer, tag=wire.tag(1, 0)), 5)
        print("ANSWERED", wire.unpack(buffer).get("status"))
    except BaseException as e:
        print("REFUSED", type(e).__name__)

asyncio.run(main(*sys.argv[1:]))
"""


def plane_contact(dask_worker=None):
    return hook.PLANES[dask_worker.address].contact()


def set_limit(n, dask_worker=None):
    dask_worker.transfer_outgoing_count_limit = n


def gather_story(dask_worker=None):
    return [e[0] for e in dask_worker.state.log if str(e[0]).startswith("gather-dep")]


def die_when_asked(dask_worker=None):
    plane = hook.PLANES[dask_worker.address]

    async def serve(endpoint, request):
        os._exit(1)

    plane._serve = serve


@pytest.fixture(scope="module")
def ucx_cluster():
    pytest.importorskip("ucxx")
    pytest.importorskip("distributed_ucxx")
    from distributed import Client, LocalCluster

    from spillway.cluster.dataplane import DataPlanePlugin

    with pytest.MonkeyPatch.context() as env:
        # the worker processes start from this environment
        env.setenv("UCX_TLS", "tcp")
        env.setenv("UCX_WARN_UNUSED_ENV_VARS", "n")
        with LocalCluster(n_workers=3, threads_per_worker=1, protocol="ucx", host="127.0.0.1",
                          dashboard_address=None, processes=True) as cluster, Client(cluster) as client:
            client.wait_for_workers(3, timeout=120)  # a loaded machine starts them slowly
            client.register_plugin(DataPlanePlugin())
            yield client


def test_chunks_move_over_the_plane_bit_for_bit(ucx_cluster):
    from distributed import wait

    client = ucx_cluster
    a, b, _ = sorted(client.scheduler_info()["workers"])
    before = client.run(hook.counters)
    for n, seed in ((8, 1), (1 << 20, 2), (24 << 20, 3)):
        x = client.submit(make, n, seed, workers=[a], pure=False)
        wait(x)
        assert client.submit(same, x, n, seed, workers=[b], pure=False).result(timeout=60)
    t = client.submit(pair, 1 << 16, 4, workers=[a], pure=False)
    assert client.submit(pair_same, t, 1 << 16, 4, workers=[b], pure=False).result(timeout=60)
    after = client.run(hook.counters)
    assert after[b]["fetched"] - before[b]["fetched"] == 4
    assert after[a]["served"] - before[a]["served"] == 4
    assert after[b]["fetched_bytes"] - before[b]["fetched_bytes"] >= 25 << 20
    # the arrays went into receives posted before the request (their sizes were known);
    # the tuple did not fit one and came after
    assert after[b]["slotted"] - before[b]["slotted"] == 3
    # distributed's own log still records each transfer (the bench times moves from it)
    assert len([e for e in client.run(incoming, workers=[b])[b]]) >= 4


def test_a_gather_of_many_keys_is_one_request(ucx_cluster):
    from distributed import wait

    client = ucx_cluster
    a, b, _ = sorted(client.scheduler_info()["workers"])
    parts = [client.submit(make, 1 << 16, 100 + i, workers=[a], pure=False) for i in range(20)]
    wait(parts)
    counted = client.run(hook.counters, workers=[b])[b]
    before, slotted = counted["fetched"], counted["slotted"]

    def all_same(*received):
        return all(np.array_equal(r, make(1 << 16, 100 + i)) for i, r in enumerate(received))

    assert client.submit(all_same, *parts, workers=[b], pure=False).result(timeout=60)
    counted = client.run(hook.counters, workers=[b])[b]
    fetches = counted["fetched"] - before
    assert 1 <= fetches < 20  # distributed batches one peer's keys into a gather, the plane one request
    assert counted["slotted"] - slotted <= fetches  # receives posted ahead only for one-key gathers


def test_a_busy_sender_is_retried_then_serves(ucx_cluster):
    from distributed import wait

    client = ucx_cluster
    a, b, _ = sorted(client.scheduler_info()["workers"])
    x = client.submit(make, 1 << 20, 5, workers=[a], pure=False)
    wait(x)
    client.run(set_limit, 0, workers=[a])
    try:
        y = client.submit(same, x, 1 << 20, 5, workers=[b], pure=False)
        deadline = time.time() + 20
        while "gather-dep-busy" not in client.run(gather_story, workers=[b])[b] and time.time() < deadline:
            time.sleep(0.1)
        assert "gather-dep-busy" in client.run(gather_story, workers=[b])[b]
        assert not y.done()
    finally:
        client.run(set_limit, 10, workers=[a])
    assert y.result(timeout=60)
    assert client.run(hook.counters, workers=[b])[b]["busy"] >= 1


def test_a_stranger_without_the_secret_reads_nothing_from_a_plane(ucx_cluster):
    import subprocess
    import sys

    from distributed import wait

    client = ucx_cluster
    a = sorted(client.scheduler_info()["workers"])[0]
    x = client.submit(make, 1 << 16, 7, workers=[a], pure=False)
    wait(x)
    contact = client.run(plane_contact, workers=[a])[a]
    before = client.run(hook.counters, workers=[a])[a]
    out = subprocess.run([sys.executable, "-c", STRANGER, contact["host"], str(contact["port"]), x.key],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "UCX_TLS": "tcp", "UCX_WARN_UNUSED_ENV_VARS": "n"})
    print(out.stdout, out.stderr[-2000:])
    assert out.stdout.startswith("REFUSED"), out.stdout + out.stderr[-2000:]
    after = client.run(hook.counters, workers=[a])[a]
    assert after["refused"] == before["refused"] + 1 and after["served"] == before["served"]
    # the cluster's own gathers still go over the plane
    b = sorted(client.scheduler_info()["workers"])[1]
    assert client.submit(same, x, 1 << 16, 7, workers=[b], pure=False).result(timeout=60)


def test_a_sender_lost_mid_request_fails_the_gather_and_the_key_is_recomputed(ucx_cluster):
    from distributed import wait

    client = ucx_cluster
    workers = sorted(client.scheduler_info()["workers"])
    a, b = workers[0], workers[1]
    x = client.submit(make, 2 << 20, 6, workers=[a], allow_other_workers=True, pure=False)
    wait(x)
    client.run(die_when_asked, workers=[a])
    assert client.submit(same, x, 2 << 20, 6, workers=[b], pure=False).result(timeout=120)
    assert "gather-dep-failed" in client.run(gather_story, workers=[b])[b]
    client.wait_for_workers(3, timeout=60)  # the nanny brought the lost worker back

