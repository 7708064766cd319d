"""Large request bodies are parsed one at a time, in a worker thread (issue 74: six
640 KB bodies parsed at once held the GIL, and with it the event loop that answers
``/healthz``, for 142-252 ms), and a large body is refused as a small one is: too many
parameters, a repeated key."""

from __future__ import annotations

import json
import threading
import time

import anyio
import pytest
from fastapi import HTTPException

from spillway.service.api import limits
from spillway.service.api.jobs import known_params
from spillway.service.api.limits import LARGE_BODY_BYTES, OffLoopRequest


class Checked(OffLoopRequest):
    checks = (known_params,)


def request(body: bytes, cls=Checked) -> OffLoopRequest:
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return cls({"type": "http", "method": "POST", "path": "/jobs", "headers": [], "query_string": b""}, receive)


def parse(body: bytes):
    async def go():
        return await request(body).json()

    return anyio.run(go)


def test_a_large_body_of_60000_keys_is_refused_by_the_checks():
    body = json.dumps({"workflow": "reduction", "params": {f"k{i:05d}": i for i in range(60_000)}}).encode()
    assert len(body) > LARGE_BODY_BYTES
    with pytest.raises(HTTPException) as e:
        parse(body)
    assert e.value.status_code == 422
    assert e.value.detail[0]["msg"].startswith("params: 60000 keys, more than the 10 parameters of reduction")
    assert e.value.__traceback__ is not None  # raised anew, from the parse


def test_a_large_body_with_a_repeated_key_is_refused_before_it_collapses():
    body = ('{"workflow": "reduction", "params": {' + ", ".join(['"op": "sum"'] * 60_000) + "}}").encode()
    assert len(body) > LARGE_BODY_BYTES
    with pytest.raises(HTTPException) as e:
        parse(body)
    assert e.value.detail[0]["msg"] == ("body: key 'op' appears more than once in one object (60000 keys, "
                                        "1 distinct); give each key once")


def test_a_large_valid_body_is_parsed():
    document = {"workflow": "reduction", "params": {"op": "sum"}}
    body = json.dumps(document).encode() + b" " * (LARGE_BODY_BYTES + 1)
    assert parse(body) == document


@pytest.mark.parametrize("size", [LARGE_BODY_BYTES + 1, 100])
def test_large_bodies_are_parsed_one_at_a_time_small_ones_together(monkeypatch, size):
    running, seen = [0], []
    lock = threading.Lock()

    class Slow(OffLoopRequest):
        def _parsed(self, body):
            with lock:
                running[0] += 1
                seen.append(running[0])
            time.sleep(0.3)
            with lock:
                running[0] -= 1
            return {}

    async def go():
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(request(b"{" + b" " * (size - 2) + b"}", Slow).json)

    monkeypatch.setattr(limits, "_loop_slots", {})
    anyio.run(go)
    assert len(seen) == 4, seen
    if size > LARGE_BODY_BYTES:
        assert max(seen) == 1, seen
    else:
        assert max(seen) >= 2, seen  # each in a thread of its own, at once
