"""The data plane (spillway.datapath.plane): its wire on its own, the hook's routing with
stand-in planes, and real workers moving chunks over UCXX (UCX's TCP transport here; CUDA
IPC between GPUs on the GPU hosts: tests/datapath/test_dataplane_gpu.py and the bench)."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest

from spillway.datapath.plane import hook, wire


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
    planes.clear()
    # the workers of this process, as the hook finds them: one at ucx://me:2 whose plugin
    # holds the plane a test sets in ``planes``
    monkeypatch.setattr(hook.upstream, "workers_of_process", lambda: [_worker_with(planes.get("ucx://me:2"))])
    return calls


#: the test worker's plane by its address (None: it has none)
planes: dict = {}


def _worker_with(plane, address="ucx://me:2"):
    from types import SimpleNamespace

    return SimpleNamespace(address=address, plugins={hook.PLUGIN_NAME: SimpleNamespace(plane=plane)})


def route(keys, worker="ucx://peer:1", who="ucx://me:2"):
    return asyncio.run(hook.routed_fetch(None, keys, worker, who=who))


def test_a_gather_goes_over_the_plane_where_both_ends_have_one(original):
    plane = planes["ucx://me:2"] = StandIn(response={"status": "OK", "data": {"k": "plane"}})
    assert route(["k"]) == {"status": "OK", "data": {"k": "plane"}}
    assert plane.asked == [("ucx://peer:1", ["k"])] and original == []


def test_the_comm_path_for_a_peer_or_worker_without_a_plane_or_a_request_too_large(original):
    assert route(["k"])["data"] == {"k": "comm"}  # this worker has no plane
    planes["ucx://me:2"] = StandIn(reaches=False)
    assert route(["k"])["data"] == {"k": "comm"}  # the peer has none
    planes["ucx://me:2"] = StandIn(response=None)  # the plane declined (too many keys)
    assert route(["k"])["data"] == {"k": "comm"}
    assert len(original) == 3


def test_busy_and_a_lost_peer_reach_distributed_as_its_own_comm_says_them(original):
    planes["ucx://me:2"] = StandIn(response={"status": "busy"})
    assert route(["k"]) == {"status": "busy"}
    from distributed.comm.core import CommClosedError

    planes["ucx://me:2"] = StandIn(fail=CommClosedError("data plane: lost ucx://peer:1"))
    with pytest.raises(OSError, match="lost"):  # gather_dep's network failure: the peer is dead
        route(["k"])
    assert original == []


def test_install_and_uninstall_swap_distributeds_function_once(monkeypatch):
    import distributed.worker

    before = distributed.worker.get_data_from_worker
    monkeypatch.setattr(hook, "_original", None)
    workers = [_worker_with(object(), "w")]
    monkeypatch.setattr(hook.upstream, "workers_of_process", lambda: workers)
    hook.install()
    hook.install()
    assert distributed.worker.get_data_from_worker is hook.routed_fetch
    assert hook._original is before
    hook.uninstall()  # a plane is left: stays
    assert distributed.worker.get_data_from_worker is hook.routed_fetch
    workers.clear()
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
from spillway.datapath.plane import wire

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
    return hook.plane_of(dask_worker).contact()


def set_limit(n, dask_worker=None):
    dask_worker.transfer_outgoing_count_limit = n


def gather_story(dask_worker=None):
    return [e[0] for e in dask_worker.state.log if str(e[0]).startswith("gather-dep")]


def die_when_asked(dask_worker=None):
    plane = hook.plane_of(dask_worker)

    async def serve(endpoint, request):
        os._exit(1)

    plane._serve = serve


@pytest.fixture(scope="module")
def ucx_cluster():
    from ucx_workers import ucx_workers

    from spillway.datapath.plane import DataPlanePlugin

    with ucx_workers(DataPlanePlugin()) as client:
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


# --- faults short of a lost peer (over UCXX too)


def plane_of(dask_worker):
    return hook.plane_of(dask_worker)


def held_on(client, worker, n, seed):
    """A chunk of ``n`` bytes made on ``worker`` (its future)."""
    from distributed import wait

    x = client.submit(make, n, seed, workers=[worker], pure=False)
    wait(x)
    return x


def break_serving(dask_worker=None):
    """The sender fails to describe what it serves (as a serialization error would)."""
    def fail(*args, **kwargs):
        raise RuntimeError("cannot serialize this value")

    wire._spillway_describe = wire.describe_reply
    wire.describe_reply = fail


def mend_serving(dask_worker=None):
    wire.describe_reply = wire._spillway_describe


def test_a_sender_that_fails_to_serve_answers_at_once_and_the_gather_goes_over_the_comm(ucx_cluster):
    client = ucx_cluster
    a, b, _ = sorted(client.scheduler_info()["workers"])
    x = held_on(client, a, 1 << 20, 7)
    before = client.run(hook.counters)
    failed = client.run(gather_story, workers=[b])[b].count("gather-dep-failed")
    client.run(break_serving, workers=[a])
    try:
        # answered with the error, not left to the reply's timeout (300 s), which outlasts this
        assert client.submit(same, x, 1 << 20, 7, workers=[b], pure=False).result(timeout=120)
    finally:
        client.run(mend_serving, workers=[a])
    after = client.run(hook.counters)
    assert after[a]["serve_errors"] - before[a]["serve_errors"] == 1
    assert after[b]["fallbacks"] - before[b]["fallbacks"] == 1
    assert after[b]["lost"] == before[b]["lost"]
    assert client.run(gather_story, workers=[b])[b].count("gather-dep-failed") == failed


def slow_serving(seconds, dask_worker=None):
    plane = plane_of(dask_worker)
    serve = plane._serve

    async def slow(endpoint, request):
        await asyncio.sleep(seconds)
        return await serve(endpoint, request)

    plane._spillway_serve = serve
    plane._serve = slow


def quick_serving(dask_worker=None):
    plane = plane_of(dask_worker)
    plane._serve = plane._spillway_serve


async def two_fetches_one_cancelled(peer, first, second, dask_worker=None):
    plane = plane_of(dask_worker)
    await plane.fetch(peer, [first])  # the endpoint is up
    endpoint = plane._channels[peer].endpoint
    cancelled = asyncio.ensure_future(plane.fetch(peer, [first]))
    other = asyncio.ensure_future(plane.fetch(peer, [second]))
    await asyncio.sleep(0.3)  # both asked, neither answered
    cancelled.cancel()
    reply = await other
    later = await plane.fetch(peer, [second])  # on a new endpoint
    return (reply["status"], list(reply["data"]), later["status"], endpoint.closed,
            plane._channels[peer].endpoint is not endpoint)


def test_a_fetch_cancelled_does_not_fail_the_others_to_the_same_peer(ucx_cluster):
    client = ucx_cluster
    a, b, _ = sorted(client.scheduler_info()["workers"])
    x, y = held_on(client, a, 1 << 16, 8), held_on(client, a, 1 << 16, 9)
    before = client.run(hook.counters, workers=[b])[b]
    client.run(slow_serving, 1.0, workers=[a])
    try:
        status, keys, later, old_closed, renewed = client.run(two_fetches_one_cancelled, a, x.key, y.key,
                                                              workers=[b])[b]
    finally:
        client.run(quick_serving, workers=[a])
    assert status == "OK" and keys == [y.key] and later == "OK"
    assert old_closed and renewed  # retired, closed after its last fetch; a new one since
    assert client.run(hook.counters, workers=[b])[b]["lost"] == before["lost"]


def endpoints_failing(times, dask_worker=None):
    """The next ``times`` endpoints this worker opens fail as a first contact that times
    out does; its endpoint to every peer is retired first."""
    import ucxx

    plane = plane_of(dask_worker)
    for peer in list(plane._channels):
        plane._forget(peer)
    create = getattr(ucxx, "_spillway_create", ucxx.create_endpoint)
    ucxx._spillway_create = create
    left = [times]

    async def flaky(*args, **kwargs):
        if left[0] > 0:
            left[0] -= 1
            raise TimeoutError("exchange_peer_info timed out")
        return await create(*args, **kwargs)

    ucxx.create_endpoint = flaky


def endpoints_back(dask_worker=None):
    import ucxx

    ucxx.create_endpoint = ucxx._spillway_create
    plane_of(dask_worker)._unreachable.clear()


def test_an_endpoint_that_times_out_once_is_retried_and_the_gather_stays_on_the_plane(ucx_cluster):
    client = ucx_cluster
    a, b, _ = sorted(client.scheduler_info()["workers"])
    x = held_on(client, a, 1 << 20, 10)
    before = client.run(hook.counters, workers=[b])[b]
    client.run(endpoints_failing, 1, workers=[b])
    try:
        assert client.submit(same, x, 1 << 20, 10, workers=[b], pure=False).result(timeout=60)
    finally:
        client.run(endpoints_back, workers=[b])
    after = client.run(hook.counters, workers=[b])[b]
    assert after["fetched"] - before["fetched"] == 1
    assert after["connect_failures"] == before["connect_failures"] and after["lost"] == before["lost"]


def test_an_endpoint_that_never_comes_up_sends_the_gather_over_the_comm_not_as_a_lost_peer(ucx_cluster):
    from spillway.datapath.plane import plane

    client = ucx_cluster
    a, b, _ = sorted(client.scheduler_info()["workers"])
    x = held_on(client, a, 1 << 20, 11)
    before = client.run(hook.counters, workers=[b])[b]
    failed = client.run(gather_story, workers=[b])[b].count("gather-dep-failed")
    client.run(endpoints_failing, plane.CONNECT_TRIES, workers=[b])
    try:
        assert client.submit(same, x, 1 << 20, 11, workers=[b], pure=False).result(timeout=60)
        after = client.run(hook.counters, workers=[b])[b]
    finally:
        client.run(endpoints_back, workers=[b])
    assert after["connect_failures"] - before["connect_failures"] == 1
    assert after["fetched"] == before["fetched"] and after["lost"] == before["lost"]
    assert client.run(gather_story, workers=[b])[b].count("gather-dep-failed") == failed
    assert any(who == a for who, _ in client.run(incoming, workers=[b])[b])  # over the comm


async def warm_again(dask_worker=None):
    plane = plane_of(dask_worker)
    for peer in list(plane._channels):
        plane._forget(peer)
    opened = await plane.warm()
    return opened, sorted(plane._channels)


def test_a_plane_opens_its_endpoints_to_every_peer_in_the_background(ucx_cluster):
    client = ucx_cluster
    workers = sorted(client.run(os.getpid))  # the workers that answer now, not a cached identity
    opened, peers = client.run(warm_again, workers=[workers[0]])[workers[0]]
    assert opened == 2 and peers == workers[1:]


async def ready_after_forgetting(dask_worker=None):
    from spillway.datapath.plane.plugin import plane_ready

    plane = plane_of(dask_worker)
    for peer in list(plane._channels):
        plane._forget(peer)  # as if its peers' listeners were not up when it warmed
    return await plane_ready(dask_worker, timeout=60), sorted(plane._channels)


def test_a_plane_is_ready_once_it_has_an_endpoint_to_every_peer(ucx_cluster):
    # what a new cluster waits for before it says it is ready (session._planes_ready)
    client = ucx_cluster
    workers = sorted(client.run(os.getpid))
    peers, channels = client.run(ready_after_forgetting, workers=[workers[0]])[workers[0]]
    assert peers == len(workers) - 1 and channels == workers[1:]


def test_a_new_cluster_waits_for_its_planes(ucx_cluster, caplog):
    import logging

    from spillway.launch.session import _planes_ready

    with caplog.at_level(logging.INFO, "spillway"):
        _planes_ready(ucx_cluster)
    assert "reach fewer than all their peers" not in caplog.text


async def warm_transfer(peer, dask_worker=None):
    plane = plane_of(dask_worker)
    before = plane.counters.fetched_bytes
    answer = await plane.fetch(peer, [], warm=4096)
    return answer, plane.counters.fetched_bytes - before


def channels_to(dask_worker=None):
    return sorted(plane_of(dask_worker)._channels)


def test_a_warm_up_takes_bytes_from_the_peer_and_the_peer_warms_back(ucx_cluster):
    """A GPU plane's warm-up moves a buffer of the peer's pool (here, on CPU workers, a host
    one): the reply is an answer with no keys, the bytes counted as fetched, and the peer,
    which had no endpoint to the asker, opens one in turn."""
    client = ucx_cluster
    a, b = sorted(client.run(os.getpid))[:2]
    client.run(warm_again, workers=[b])  # b's channels closed, then reopened: forget them
    client.run(lambda dask_worker=None: [plane_of(dask_worker)._forget(p)
                                         for p in list(plane_of(dask_worker)._channels)], workers=[b])
    answer, moved = client.run(warm_transfer, b, workers=[a])[a]
    assert answer == {"status": "OK", "data": {}} and moved == 4096
    deadline = time.monotonic() + 30
    while a not in client.run(channels_to, workers=[b])[b] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert a in client.run(channels_to, workers=[b])[b]


# --- the plane's bookkeeping of peers, no UCXX


class Rpc:
    def __init__(self, answers):
        self.answers = answers

    def __call__(self, peer):
        answers = self.answers

        class Handlers:
            async def dataplane_contact(self):
                answer = answers[peer].pop(0)
                if isinstance(answer, Exception):
                    raise answer
                return answer

        return Handlers()


def test_a_peer_without_a_plane_is_asked_again_after_a_while(monkeypatch):
    from types import SimpleNamespace

    from spillway.datapath.plane import plane as plane_module

    clock = [1000.0]
    monkeypatch.setattr(plane_module.time, "monotonic", lambda: clock[0])
    worker = SimpleNamespace(address="ucx://10.0.0.1:1",
                             rpc=Rpc({"ucx://10.0.0.2:1": [OSError("no handler"), {"host": "h", "port": 7}]}))
    plane = plane_module.DataPlane(worker)
    assert not asyncio.run(plane.reaches("ucx://10.0.0.2:1"))
    clock[0] += plane_module.UNREACHABLE_RETRY_S / 2
    assert not asyncio.run(plane.reaches("ucx://10.0.0.2:1"))  # not asked again yet
    clock[0] += plane_module.UNREACHABLE_RETRY_S
    assert asyncio.run(plane.reaches("ucx://10.0.0.2:1"))  # asked again: it has one now
    assert asyncio.run(plane.reaches("ucx://10.0.0.2:1"))  # and remembered


def test_a_request_says_who_asks_so_the_sender_applies_distributeds_same_host_limit():
    from types import SimpleNamespace

    from spillway.datapath.plane import plane as plane_module

    sent = []

    class Endpoint:
        closed = False

        async def send(self, message, tag=None):
            sent.append(wire.unpack(message) if tag == wire.tag(1, 0) else None)

    worker = SimpleNamespace(address="tcp://10.0.0.1:1", status=SimpleNamespace(name="running"),
                             transfer_outgoing_count_limit=1, transfer_outgoing_count=1,
                             transfer_outgoing_count_total=0, transfer_outgoing_bytes=0,
                             transfer_outgoing_bytes_total=0, transfer_outgoing_log=[], data={}, scheduler_delay=0,
                             state=SimpleNamespace(tasks={}))
    plane = plane_module.DataPlane(worker)
    asyncio.run(plane._serve(Endpoint(), {"id": 1, "keys": ["k"], "who": "tcp://10.0.0.9:1"}))
    assert sent[-1]["status"] == "busy"  # another host: at its limit of 1
    asyncio.run(plane._serve(Endpoint(), {"id": 1, "keys": ["k"], "who": "tcp://10.0.0.1:2"}))
    assert sent[-1]["status"] == "OK"  # this host: twice the limit


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


# --- last, as it costs the cluster a worker (its nanny brings it back)


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

