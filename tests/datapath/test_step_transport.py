"""The exchange's transports, two ends in one process: whole buffers under tags, in any
order of posting, bits kept; a peer that closes fails what waits on it at once; an abort
ends a wait; the choice of transport and the tags' room."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from spillway.datapath.step.state import make
from spillway.datapath.step.transport import (AUTO_KINDS, KINDS, StepAborted, TransportError, chosen, offered, tag_of,
                                              wait)


def _kinds():
    try:
        import ucxx  # noqa: F401
    except ImportError:
        return ["host", pytest.param("ucxx", marks=pytest.mark.skip(reason="UCXX is not installed"))]
    return ["host", "ucxx"]


@pytest.fixture(params=_kinds())
def pair(request):
    a = make(request.param, host="127.0.0.1", gpu=False)
    b = make(request.param, host="127.0.0.1", gpu=False)
    yield a, b
    a.close()
    b.close()


def _never():
    return None


def test_buffers_cross_whole_in_both_directions_whichever_end_posts_first(pair):
    a, b = pair
    rng = np.random.default_rng(5)
    ab = [rng.standard_normal(n) for n in (1, 1000, 3_000_001)]
    ba = [rng.integers(0, 1 << 30, n, dtype=np.int64) for n in (7, 250_000)]
    deadline = time.monotonic() + 30
    # a sends before b posts its receives; b's sends wait for a's posts
    sends = [a.send(b.address(), tag_of(1, 0, k, 0), x) for k, x in enumerate(ab)]
    got_ab = [np.empty_like(x) for x in ab]
    recvs = [b.recv(a.address(), tag_of(1, 0, k, 0), got) for k, got in enumerate(got_ab)]
    got_ba = [np.empty_like(x) for x in ba]
    recvs += [a.recv(b.address(), tag_of(2, 3, k, 0), got) for k, got in enumerate(got_ba)]
    sends += [b.send(a.address(), tag_of(2, 3, k, 0), x) for k, x in enumerate(ba)]
    wait(sends + recvs, aborted=_never, deadline=deadline, what="test")
    for want, got in zip(ab + ba, got_ab + got_ba):
        assert np.array_equal(want, got)


def test_an_abort_ends_a_wait_with_its_reason(pair):
    a, b = pair
    pending = [b.recv(a.address(), tag_of(9, 0, 0, 0), np.empty(10))]
    ended = threading.Event()
    threading.Timer(0.2, ended.set).start()
    began = time.monotonic()
    with pytest.raises(StepAborted, match="worker tcp://x left"):
        wait(pending, aborted=lambda: "worker tcp://x left" if ended.is_set() else None,
             deadline=time.monotonic() + 30, what="test")
    assert time.monotonic() - began < 5
    b.forget(9, pending)


def test_a_wait_past_its_deadline_fails_in_one_line(pair):
    a, b = pair
    pending = [b.recv(a.address(), tag_of(10, 0, 0, 0), np.empty(10))]
    with pytest.raises(TransportError, match="1 transfer\\(s\\) still pending"):
        wait(pending, aborted=_never, deadline=time.monotonic() + 0.3, what="test")
    b.forget(10, pending)


def test_a_closed_host_peer_fails_its_receives_at_once():
    a = make("host", host="127.0.0.1", gpu=False)
    b = make("host", host="127.0.0.1", gpu=False)
    try:
        first = np.arange(5.0)
        got = np.empty(5)
        wait([a.send(b.address(), tag_of(3, 0, 0, 0), first), b.recv(a.address(), tag_of(3, 0, 0, 0), got)],
             aborted=_never, deadline=time.monotonic() + 10, what="test")
        pending = [b.recv(a.address(), tag_of(3, 1, 0, 0), np.empty(5))]
        a.close()
        began = time.monotonic()
        with pytest.raises(TransportError, match="closed"):
            wait(pending, aborted=_never, deadline=time.monotonic() + 30, what="test")
        assert time.monotonic() - began < 5
    finally:
        b.close()


def test_a_payload_of_an_ended_exchange_is_dropped_and_the_connection_goes_on():
    a = make("host", host="127.0.0.1", gpu=False)
    b = make("host", host="127.0.0.1", gpu=False)
    try:
        b.forget(4, [])
        late = a.send(b.address(), tag_of(4, 0, 0, 0), np.ones(100))
        got = np.empty(3)
        wait([late, a.send(b.address(), tag_of(5, 0, 0, 0), np.arange(3.0)), b.recv(a.address(), tag_of(5, 0, 0, 0), got)],
             aborted=_never, deadline=time.monotonic() + 10, what="test")
        assert np.array_equal(got, np.arange(3.0))
    finally:
        a.close()
        b.close()


def test_a_size_that_differs_from_the_posted_buffer_fails_that_receive_only():
    a = make("host", host="127.0.0.1", gpu=False)
    b = make("host", host="127.0.0.1", gpu=False)
    try:
        wrong = b.recv(a.address(), tag_of(6, 0, 0, 0), np.empty(4))
        right = np.empty(2)
        after = b.recv(a.address(), tag_of(6, 0, 1, 0), right)
        a.send(b.address(), tag_of(6, 0, 0, 0), np.ones(5))
        a.send(b.address(), tag_of(6, 0, 1, 0), np.array([1.0, 2.0]))
        with pytest.raises(TransportError, match="40 bytes under tag .* 32 expected"):
            wait([wrong], aborted=_never, deadline=time.monotonic() + 10, what="test")
        wait([after], aborted=_never, deadline=time.monotonic() + 10, what="test")
        assert np.array_equal(right, [1.0, 2.0])
    finally:
        a.close()
        b.close()


def test_tags_name_exchange_round_slots_and_message_apart():
    tags = {tag_of(x, r, s, d, m) for x in (0, 1, (1 << 20) - 1) for r in (0, 255) for s in (0, 4095)
            for d in (0, 2, 4095) for m in (0, 4095)}
    assert len(tags) == 72 and all(0 <= t < 1 << 64 for t in tags)
    with pytest.raises(ValueError, match="slots 4096 and 0, round 0 or message 0 past the tag's room"):
        tag_of(0, 0, 1 << 12, 0)


def test_the_kind_every_step_offers_is_chosen_in_order():
    here, there = "host-a/boot/0000:18:00.0", "host-a/boot/0000:2a:00.0"
    gpu = {"ipc": here, "ucxx": "u", "host": "h"}
    assert chosen([gpu, dict(gpu)]) == "ipc"
    # a put kind only where every step offers it at one address (one GPU): two GPUs take UCXX
    assert chosen([gpu, {**gpu, "ipc": there}]) == "ucxx"
    assert chosen([gpu, {"ucxx": "u", "host": "h"}]) == "ucxx"
    assert chosen([gpu, {"host": "h"}]) == "host"
    assert offered("host") == ("host",)
    assert offered("ucxx") == ("ucxx", "host")
    assert offered("ipc", gpu=True) == ("ipc", "host")
    # CPU workers never offer CUDA IPC, asked for or not
    assert offered("ipc") == ("host",)
    assert "ipc" not in offered("auto")
    # GPU workers offer CUDA IPC first under auto; its address is the GPU's, so workers of
    # two GPUs (or hosts) take UCXX
    assert offered("auto", gpu=True) == ("ipc", *offered("auto"))
    assert offered("auto", gpu=True) == tuple(k for k in AUTO_KINDS if k in offered("auto", gpu=True))
    with pytest.raises(ValueError, match="exchange-transport 'nccl' is not auto or one of ipc, ucxx, host"):
        offered("nccl")
