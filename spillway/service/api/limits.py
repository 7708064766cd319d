"""What one request may cost the service: the body's size and the time to send it.

:class:`RequestLimits` is pure ASGI middleware, outermost in the app, so it acts before
routing, JSON parsing and authentication. A declared ``Content-Length`` over the limit is
answered 413 at once without reading the body; a body is read whole (it is at most the
limit, 1 MiB by default) against one deadline for all of it, so a client that sends
slowly, or declares more than it sends, gets 408 within ``body_timeout_s``, and the
connection is closed. uvicorn has no body timeout of its own (its ``timeout_keep_alive``
covers idle connections between requests only), and Starlette's ``RequestBodyLimitMiddleware``
applies only when a route reads the body, with no deadline.

The app then reads the buffered body at once; FastAPI's JSON parsing runs in a worker
thread (:class:`OffLoopJSONRoute`), so a large document never holds the event loop that
answers ``/healthz``; bodies past :data:`LARGE_BODY_BYTES` are parsed one at a time, since
the parser holds the GIL for a whole document and several at once kept the loop from it.

The limits are :class:`~.settings.ServiceLimits`; what a client may hold before its request
reaches the app (the header deadline, the connection caps) is :mod:`.connections`.
"""

from __future__ import annotations

import json

import anyio
from fastapi import HTTPException, Request
from fastapi.routing import APIRoute

from spillway.options.sizes import format_bytes
from .settings import ServiceLimits

class BodyStats:
    """What the body limits refused, for ``/metrics``: bodies cut at their deadline (408)
    and bodies past the size limit (413)."""

    def __init__(self):
        self.timed_out = 0
        self.too_large = 0


class RequestLimits:
    """Pure ASGI middleware enforcing :class:`ServiceLimits` before anything else runs
    (authentication aside: :mod:`.gate` answers from the headers first)."""

    def __init__(self, app, limits: ServiceLimits, stats: BodyStats | None = None):
        self.app = app
        self.limits = limits
        self.stats = stats if stats is not None else BodyStats()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length, chunked = None, False
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = -1
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        limit = self.limits.max_request_bytes
        if length is not None and length > limit:
            self.stats.too_large += 1
            return await _refuse(send, 413, f"request body: Content-Length {length} bytes exceeds the service's "
                                            f"limit of {format_bytes(limit)} ({limit} bytes)")
        if not chunked and not length:
            return await self.app(scope, receive, send)  # no body to wait for
        body = bytearray()
        disconnected = False
        with anyio.move_on_after(self.limits.body_timeout_s) as deadline:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected = True
                    break
                body += message.get("body", b"")
                if len(body) > limit:
                    self.stats.too_large += 1
                    return await _refuse(send, 413, f"request body: more than {format_bytes(limit)} "
                                                    f"({limit} bytes), the service's limit")
                if not message.get("more_body", False):
                    break
        if deadline.cancelled_caught:
            self.stats.timed_out += 1
            expected = f" of {length}" if length else ""
            return await _refuse(send, 408, f"request body: {len(body)}{expected} bytes received in "
                                            f"{self.limits.body_timeout_s:g} s, the service's limit; "
                                            "send the whole body at once")
        if disconnected:
            return  # nobody to answer
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _refuse(send, status: int, detail: str):
    """A JSON error that also closes the connection: the rest of the body, if any, is
    never read, so the connection cannot carry another request."""
    payload = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload})


#: bodies past this many bytes are parsed one at a time (:meth:`OffLoopRequest.json`); a
#: job's body is a few hundred bytes, and one this size parses in about a millisecond
LARGE_BODY_BYTES = 64 * 2**10

_loop_slots: dict = {}


def loop_slots(name: str, n: int) -> anyio.Semaphore:
    """``n`` slots named ``name`` of the running event loop, for work handed to threads
    that must not all run at once (an ``anyio.Semaphore`` belongs to the loop it is first
    used in; tests start several loops, one after another)."""
    import asyncio

    loop = asyncio.get_running_loop()
    slots = _loop_slots.get((loop, name))
    if slots is None:
        for key in [k for k in _loop_slots if k[0] is not loop]:
            del _loop_slots[key]  # of a loop that ended
        slots = _loop_slots[(loop, name)] = anyio.Semaphore(n)
    return slots


def _large_parses() -> anyio.Semaphore:
    return loop_slots("large parses", 1)


class OffLoopRequest(Request):
    """A request whose JSON body is parsed in a worker thread, not on the event loop, and
    checked there by ``checks`` (each takes the document and raises :func:`refusal`)
    before any validation sees it."""

    checks: tuple = ()

    async def json(self):
        if not hasattr(self, "_json"):
            body = await self.body()
            if len(body) <= LARGE_BODY_BYTES:
                self._json = await anyio.to_thread.run_sync(self._parsed, body)
            else:
                # the parser holds the GIL for the whole document (tens of ms at 640 KB), so
                # six at once kept the event loop from it for 142-252 ms (issue 74): one at
                # a time, the others waiting on the loop, not in the thread pool
                async with _large_parses():
                    self._json = await anyio.to_thread.run_sync(self._parsed, body)
        return self._json

    def _parsed(self, body: bytes):
        if len(body) <= LARGE_BODY_BYTES:
            document = json.loads(body, object_pairs_hook=_once_each)
            for check in self.checks:
                check(document)
            return document
        # a large body is parsed plainly first: the check for repeated keys makes a tuple of
        # each key (60,000 objects for the collector, twice the parser's time), and a body
        # of that many distinct keys is refused by the checks without it
        document = json.loads(body)
        try:
            for check in self.checks:
                check(document)
        except HTTPException as e:
            # the refusal's traceback holds the document: freed here, in this thread, not on
            # the event loop when the answer is sent
            refused = e.with_traceback(None)
        else:
            refused = None
        del document
        if refused is not None:
            raise refused
        return json.loads(body, object_pairs_hook=_once_each)


class OffLoopJSONRoute(APIRoute):
    """The app's routes: FastAPI's handler with :class:`OffLoopRequest`; a subclass names
    the ``body_checks`` of its routes' documents."""

    body_checks: tuple = ()

    def get_route_handler(self):
        handler = super().get_route_handler()
        request_class = (type("CheckedRequest", (OffLoopRequest,), {"checks": tuple(self.body_checks)})
                         if self.body_checks else OffLoopRequest)

        async def off_loop(request: Request):
            return await handler(request_class(request.scope, request.receive))

        return off_loop


def _once_each(pairs: list) -> dict:
    """A JSON object whose keys are each given once: a repeated key is refused before the
    object collapses it, so a body's size is counted as sent (60,000 copies of one key
    passed every cap as one key)."""
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set = set()
        for key, _ in pairs:
            if key in seen:
                break
            seen.add(key)
        shown = repr(key) if len(key) <= 64 and key.isprintable() else f"of {len(key)} characters"
        raise HTTPException(422, [{"loc": ["body"], "msg": f"body: key {shown} appears more than once "
                                   f"in one object ({len(pairs)} keys, {len(document)} distinct); "
                                   "give each key once", "type": "value_error"}])
    return document


def refusal(field: str, message: str) -> HTTPException:
    """A 422 in FastAPI's validation shape (as :func:`.errors.param_error`), raised where a
    validation error would be turned into a 400 (while the body is parsed)."""
    return HTTPException(422, [{"loc": ["body", *field.split(".")], "msg": message, "type": "value_error"}])
