"""One worker's end of the data plane: a UCXX listener that serves its chunks, and an
endpoint to each peer it fetches from, kept open for the worker's life.

A fetch is one request and its reply: the receiver posts the reply's receive and sends the
keys; the sender reads the values from its store, sends what they are (the reply) and then
every frame at once; the receiver allocates each device frame from its RMM resource (the
pool, the statistics and spill on demand that every allocation of the worker goes through)
and receives them all at once. The completion of the rendezvous is the acknowledgement:
there is no trailing "OK" as in distributed's gather, and no pooled comm to take and give
back. Several fetches share one endpoint, each under its own tags.

It keeps the contract of distributed's gather function (:mod:`.hook`): ``{"status": "OK",
"data"}`` (keys the sender no longer holds left out), ``{"status": "busy"}`` when the sender
is at its limit of transfers (distributed's rule, :func:`~spillway.upstream.outgoing_at_limit`),
and ``OSError`` when the peer is lost, so that the worker's state machine retries,
refetches or recomputes exactly as it does over its comm.

What goes wrong short of a lost peer never reads as one:

* a sender that fails to serve (a restore from disk, serialization) answers at once that
  the fetcher should go over the comm instead (``fallback``), rather than leave it
  waiting out :data:`REPLY_TIMEOUT_S`;
* an endpoint that does not come up (a peer still starting its listener, a slow first
  contact between workers that all start at once) is tried again with backoff
  (:data:`CONNECT_TRIES`); where it still fails, the gather goes over the comm and the
  peer is tried on the plane again after :data:`UNREACHABLE_RETRY_S`;
* a fetch that fails or is cancelled retires its endpoint (later fetches open a new one)
  without aborting it: the other fetches on it finish, and it closes after the last;
* a peer without a plane is asked again after :data:`UNREACHABLE_RETRY_S`.

When a worker's plane starts it opens its endpoints to the peers it knows, a few at a time
in the background, and moves a little of each peer's pool over each (:meth:`DataPlane.warm`),
so that neither first contact nor the mapping of a peer's pool is paid inside a gather.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import statistics
import time

from spillway import upstream
from . import wire

logger = logging.getLogger("spillway.dataplane")

#: seconds a reply may take to start: the sender may restore the values from host or disk
#: first. A peer that dies fails the fetch at once (UCX's endpoint error handling); this
#: bounds only a peer that hangs.
REPLY_TIMEOUT_S = 300.0
#: fetches and serves whose phases a plane keeps (the latest), for :meth:`Counters.phases`
TRACE_LENGTH = 4096
#: tries to bring up an endpoint to a peer, and the seconds each may take; between them
#: the wait grows from :data:`CONNECT_BACKOFF_S` fourfold
CONNECT_TRIES = 3
CONNECT_TIMEOUT_S = 10.0
CONNECT_BACKOFF_S = 0.1
#: seconds before a peer that has no plane, or whose endpoint would not come up, is
#: tried on the plane again (its gathers go over the comm meanwhile)
UNREACHABLE_RETRY_S = 30.0
#: endpoints a starting plane opens at once to the peers it knows
WARM_CONCURRENCY = 4
#: bytes a GPU plane's warm-up takes from each peer's pool once its endpoint is up: UCX
#: opens the CUDA IPC handle of the peer's whole pool at the first device transfer from
#: it, which took 1.7-2.0 s inside the first bulk exchange on two H200s (pools of 90% of
#: 141 GB)
WARM_BYTES = 1 << 20
#: seconds the serving side waits for its producer's kernels while spinning the loop; past
#: it, it checks every :data:`READY_POLL_S`
READY_SPIN_S = 0.002
READY_POLL_S = 0.0002


def _device_buffer(nbytes: int):
    import rmm

    return rmm.DeviceBuffer(size=nbytes)


async def _default_stream_done() -> None:
    """Wait for the work queued on the default CUDA stream before UCX writes into buffers
    just taken from the pool (stream-ordered frees may hand out memory that queued kernels
    still use, and UCX copies on streams of its own), by polling an event on the worker's
    event loop. distributed-ucxx synchronizes the stream instead, which holds the whole
    loop for as long as the device has work queued: no request of a peer is read or served
    meanwhile. On two H200s a reply to a fetch took 0.58-0.72 s while its sender served it
    in 3 ms (W4, FFTs queued on the worker's device)."""
    import cupy

    event = cupy.cuda.Event(block=False, disable_timing=True)
    event.record(cupy.cuda.Stream.null)
    await _wait_for([event])


class Counters:
    """What a plane did since its worker started: fetches and serves, their bytes and
    seconds, busy replies and requests that went over the comm instead; and where the
    latest ones spent their time, phase by phase (seconds from the previous phase):

    - a fetch: ``reply`` (the request sent and the reply back: the sender's reading and
      waiting included), ``allocate`` (receive buffers from the pool, and the wait for the
      device's queued work that may still use their memory), ``frames`` (the bytes);
    - a serve: ``read`` (the values from the store, restored from host or disk if spilled),
      ``produced`` (the kernels that made them, still running on the device), ``frames``.
    """

    def __init__(self):
        self.fetched = self.fetched_bytes = self.served = self.served_bytes = 0
        self.fetch_s = 0.0
        self.busy = self.fallbacks = self.lost = 0
        #: endpoints that would not come up (after every try), and serves that failed
        #: (each answered with a fallback to the comm)
        self.connect_failures = self.serve_errors = 0
        #: endpoints opened ahead by :meth:`DataPlane.warm`
        self.warmed = 0
        #: requests dropped for lacking the cluster's secret
        self.refused = 0
        #: values that went into a receive posted before the request
        self.slotted = 0
        self.fetch_trace: collections.deque = collections.deque(maxlen=TRACE_LENGTH)
        self.serve_trace: collections.deque = collections.deque(maxlen=TRACE_LENGTH)

    def phases(self) -> dict:
        """Median, total and longest seconds of each phase over the kept fetches and serves."""
        out = {}
        for side, trace in (("fetch", self.fetch_trace), ("serve", self.serve_trace)):
            if not trace:
                continue
            for name in trace[0]:
                values = [t[name] for t in trace]
                out[f"{side}_{name}"] = {"median_s": statistics.median(values), "total_s": sum(values),
                                         "max_s": max(values)}
        return out

    def as_dict(self, traces: bool = False) -> dict:
        """The counts and :meth:`phases`; ``traces``: the kept fetches and serves too, one
        ``{phase: seconds}`` each (``fetch_trace``, ``serve_trace``)."""
        out = {k: v for k, v in vars(self).items() if not k.endswith("_trace")}
        out["phases"] = self.phases()
        if traces:
            out["fetch_trace"] = [dict(t) for t in self.fetch_trace]
            out["serve_trace"] = [dict(t) for t in self.serve_trace]
        return out


class _Channel:
    """One endpoint to a peer and the fetches on it. A channel retired (a fetch on it failed
    or was cancelled: its pending tags are in doubt) takes no new fetch and is closed after
    its last one ends; the fetches already on it are not failed by it."""

    def __init__(self, endpoint):
        self.endpoint = endpoint
        self.fetches = 0
        self.retired = False

    def retire(self) -> None:
        self.retired = True
        self._close_if_idle()

    def done(self) -> None:
        self.fetches -= 1
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if self.retired and self.fetches <= 0 and not self.endpoint.closed:
            self.endpoint.abort()


class DataPlane:
    def __init__(self, worker, secret: str = ""):
        self.worker = worker
        #: the cluster's secret (:func:`.wire.authentic`): a request or reply without it is dropped
        self.secret = secret
        self.listener = None
        self.host = None
        self.counters = Counters()
        self._channels: dict[str, _Channel] = {}
        #: channels retired with fetches still on them (closed after their last, or with the plane)
        self._retired: set[_Channel] = set()
        self._connecting: dict[str, asyncio.Lock] = {}
        #: peer -> its contact ({"host", "port"}) while it has a plane
        self._contacts: dict[str, object] = {}
        #: peer -> when (monotonic) it may be tried on the plane again: it has no plane, or
        #: its endpoint would not come up
        self._unreachable: dict[str, float] = {}
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task] = set()
        #: warm-ups in flight (the one started with the worker, and those a peer's
        #: warm-up request started back, :meth:`_warm_frame`)
        self._warms: set[asyncio.Task] = set()
        #: a GPU worker posts its receives ahead on the device (:meth:`_slots`)
        self.gpu = False
        #: key -> a CUDA event recorded on the default stream when the key's task finished
        #: here: the point its kernels (queued asynchronously) end, no later
        self.produced: dict = {}

    async def start(self) -> DataPlane:
        import ucxx
        from distributed.comm.addressing import get_address_host

        # the context distributed-ucxx started for the worker's comm (one per process), its
        # progress on this loop, the worker's
        self.listener = ucxx.create_listener(self._serve_endpoint, port=0)
        self.host = get_address_host(self.worker.address)
        return self

    def contact(self) -> dict:
        return {"host": self.host, "port": self.listener.port}

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for channel in [*self._channels.values(), *self._retired]:
            if not channel.endpoint.closed:
                channel.endpoint.abort()
        self._channels.clear()
        self._retired.clear()
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    # --- the receiving side

    async def reaches(self, peer: str, *, remember: bool = True) -> bool:
        """Whether ``peer`` has a plane (asked over the worker's rpc, once while it answers;
        a peer that has none, or whose endpoint would not come up, is asked again after
        :data:`UNREACHABLE_RETRY_S`). ``remember=False``: a peer that does not answer is
        not marked (a warm-up's look, while peers are still starting)."""
        if peer in self._contacts:
            return True
        if time.monotonic() < self._unreachable.get(peer, 0.0):
            return False
        try:
            found = await self.worker.rpc(peer).dataplane_contact()
        except Exception:  # noqa: BLE001 (a peer without the handler: the comm path)
            found = None
        if isinstance(found, dict) and found.get("port"):
            self._contacts[peer] = found
            self._unreachable.pop(peer, None)
            return True
        if remember:
            self._unreachable[peer] = time.monotonic() + UNREACHABLE_RETRY_S
        return False

    def _mark_unreachable(self, peer: str) -> None:
        self._contacts.pop(peer, None)
        self._unreachable[peer] = time.monotonic() + UNREACHABLE_RETRY_S

    async def _channel(self, peer: str) -> _Channel | None:
        """The channel to ``peer`` (opened where there is none, or only a retired or
        closed one); None where its endpoint would not come up after
        :data:`CONNECT_TRIES` tries (the peer is then marked unreachable for a while)."""
        channel = self._channels.get(peer)
        if channel is not None and not channel.retired and not channel.endpoint.closed:
            return channel
        async with self._connecting.setdefault(peer, asyncio.Lock()):
            channel = self._channels.get(peer)
            if channel is not None and not channel.retired and not channel.endpoint.closed:
                return channel
            contact = self._contacts.get(peer)
            if contact is None:
                return None
            endpoint = await self._connect(peer, contact)
            if endpoint is None:
                self.counters.connect_failures += 1
                self._mark_unreachable(peer)
                return None
            channel = self._channels[peer] = _Channel(endpoint)
            return channel

    async def _connect(self, peer: str, contact: dict):
        """An endpoint to ``peer``, tried :data:`CONNECT_TRIES` times with a growing wait
        between; None where every try failed."""
        import ucxx

        wait = CONNECT_BACKOFF_S
        for attempt in range(1, CONNECT_TRIES + 1):
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    return await ucxx.create_endpoint(contact["host"], contact["port"])
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (a timeout, a refused connection, a UCX error)
                if attempt == CONNECT_TRIES:
                    logger.info("data plane: no endpoint to %s after %d tries (%s: %s); its gathers go over "
                                "the comm for %.0f s", peer, attempt, type(e).__name__, e, UNREACHABLE_RETRY_S)
                    return None
                logger.debug("data plane: endpoint to %s, try %d: %s: %s", peer, attempt, type(e).__name__, e)
            await asyncio.sleep(wait)
            wait *= 4
        return None

    def _forget(self, peer: str) -> None:
        """Retire the channel to ``peer``: later fetches open a new endpoint; the fetches
        on this one finish (or fail) on their own."""
        channel = self._channels.pop(peer, None)
        if channel is not None:
            self._retire(peer, channel)

    def warm_soon(self, peers=None) -> asyncio.Task:
        """:meth:`warm` in the background (the worker's start does not wait for it)."""
        task = asyncio.ensure_future(self.warm(peers))
        for tasks in (self._tasks, self._warms):
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        return task

    async def ready(self, timeout: float) -> int:
        """Wait, at most ``timeout`` seconds, for the warm-ups in flight (a peer's pool is
        mapped only once its warm-up's transfer is done, after its endpoint is up), then
        warm once more the peers they found not up yet (planes that start together race
        for each other's listeners). Returns the peers this plane has an endpoint to."""
        try:
            async with asyncio.timeout(timeout):
                if self._warms:
                    await asyncio.shield(asyncio.gather(*self._warms, return_exceptions=True))
                await self.warm()
        except TimeoutError:
            logger.info("data plane: %s not warmed within %.0f s; the rest connect at their first gather",
                        self.worker.address, timeout)
        return sum(1 for c in self._channels.values() if not c.retired)

    async def warm(self, peers=None) -> int:
        """Open an endpoint to each of ``peers`` (default: the workers the scheduler knows
        now) that has a plane, :data:`WARM_CONCURRENCY` at a time, and on a GPU plane take
        :data:`WARM_BYTES` of each peer's pool over it (its IPC handle opened now; the peer
        warms back, :meth:`_warm_frame`); a peer that is not up yet is left to its first
        gather. Returns the endpoints opened."""
        if peers is None:
            try:
                identity = await self.worker.scheduler.identity()
                peers = list((identity or {}).get("workers", {}))
            except Exception:  # noqa: BLE001 (no scheduler to ask: the first gathers connect)
                return 0
        peers = [p for p in peers if p != self.worker.address and p.startswith(("ucx://", "ucxx://"))]
        limit = asyncio.Semaphore(WARM_CONCURRENCY)
        opened = 0

        async def one(peer):
            nonlocal opened
            async with limit:
                try:
                    if peer in self._channels or not await self.reaches(peer, remember=False):
                        return
                    if await self._channel(peer) is not None:
                        opened += 1
                        if self.gpu:
                            await self.fetch(peer, [], warm=WARM_BYTES)
                except Exception:  # noqa: BLE001 (warming is a head start, never a failure)
                    logger.debug("data plane: warming %s failed", peer, exc_info=True)

        await asyncio.gather(*(one(p) for p in peers))
        self.counters.warmed += opened
        return opened

    def _slots(self, keys) -> list:
        """The receive to post before asking for a gather of one key whose size this worker
        knows, in the memory its values usually are (device on a GPU worker): the chunk then
        moves while its reply is still on its way. A gather of several keys shares its one
        reply's round trip between them, and posting their receives first would put the
        wait for this device's queued work (before its memory is written) ahead of the
        request: on two H100s, W3's and W4's gathers of up to 1 GiB of pieces took longer
        with a slot for every key (benchmarks/NOTES.md)."""
        if len(keys) != 1:
            return [None] * len(keys)
        nbytes = upstream.worker_key_nbytes(self.worker, keys[0])
        return [[self.gpu, nbytes] if nbytes > 0 else None]

    async def fetch(self, peer: str, keys, *, warm: int = 0) -> dict | None:
        """``keys`` from ``peer``, as distributed's gather function returns them; None where
        the request must go over the comm instead: too many keys for one control message,
        an endpoint that would not come up, or a sender that failed to serve them."""
        from distributed.comm.core import CommClosedError

        keys = list(keys)
        slots = self._slots(keys)
        try:
            request_id = next(self._ids)
            request = wire.pack(wire.signed({"id": request_id, "keys": [wire.key_out(k) for k in keys],
                                             "slots": slots, "who": self.worker.address,
                                             **({"warm": int(warm)} if warm else {})}, self.secret))
        except wire.TooLarge:
            self.counters.fallbacks += 1
            return None
        if peer not in self._contacts and not await self.reaches(peer):
            return None
        channel = await self._channel(peer)
        if channel is None:
            self.counters.fallbacks += 1
            return None
        endpoint = channel.endpoint
        channel.fetches += 1
        started = time.perf_counter()
        pending: list[asyncio.Future] = []
        try:
            async with asyncio.timeout(REPLY_TIMEOUT_S):
                slotted = [_buffer(*slot) if slot else None for slot in slots]
                if any(slot and slot[0] for slot in slots):
                    # the pool may hand out memory that kernels queued on this device still
                    # use (stream-ordered frees); UCX writes on streams of its own
                    await _default_stream_done()
                pending = [asyncio.ensure_future(endpoint.recv(buf, tag=wire.slot_tag(request_id, i)))
                           for i, buf in enumerate(slotted) if buf is not None]
                reply_buffer = wire.control_buffer()
                reply_received = asyncio.ensure_future(endpoint.recv(reply_buffer, tag=wire.tag(request_id, 0)))
                pending.append(reply_received)
                await endpoint.send(request)
                await reply_received
                reply = wire.unpack(reply_buffer)
                if not wire.authentic(reply, self.secret):
                    raise CommClosedError(f"data plane: {peer} answered without the cluster's secret")
                replied = time.perf_counter()
                if reply["status"] in ("busy", "fallback"):
                    await asyncio.gather(*pending)  # the sender fills every slot first
                    if reply["status"] == "busy":
                        self.counters.busy += 1
                        return {"status": "busy"}
                    self.counters.fallbacks += 1
                    if reply.get("error"):
                        logger.info("data plane: %s could not serve %d keys (%s): over the comm instead", peer,
                                    len(keys), reply["error"])
                    return None
                described = reply["frames"]
                frames = [_buffer(device, n) for device, n in described]
                if any(device for device, _ in described):
                    await _default_stream_done()
                allocated = time.perf_counter()
                pending += [asyncio.ensure_future(endpoint.recv(f, tag=wire.frame_tag(request_id, len(slots), i)))
                            for i, (f, (_, n)) in enumerate(zip(frames, described)) if n]
                await asyncio.gather(*pending)
        except (upstream.ucx_error(), TimeoutError) as e:
            self.counters.lost += 1
            _cancel(pending)
            self._retire(peer, channel)
            raise CommClosedError(f"data plane: lost {peer}: {type(e).__name__}: {e}") from e
        except BaseException:
            _cancel(pending)
            self._retire(peer, channel)  # cancelled mid-request: this endpoint's pending tags are in doubt
            raise
        finally:
            channel.done()
        done = time.perf_counter()
        moved = sum(n for _, n in described) + sum(slots[s][1] for s in reply.get("slot", ()) if s >= 0)
        self.counters.fetched += 1
        self.counters.fetched_bytes += moved
        self.counters.slotted += sum(1 for s in reply.get("slot", ()) if s >= 0)
        self.counters.fetch_s += done - started
        self.counters.fetch_trace.append({"reply": replied - started, "allocate": allocated - replied,
                                          "frames": done - allocated})
        return {"status": "OK", "data": wire.values_of(reply, [_host_frame(f) for f in frames],
                                                       [_host_frame(f) if f is not None else None for f in slotted])}

    def _retire(self, peer: str, channel: _Channel) -> None:
        """A fetch on ``channel`` failed: new fetches to ``peer`` take a new endpoint, the
        others on this one go on."""
        if self._channels.get(peer) is channel:
            del self._channels[peer]
        channel.retire()
        self._retired = {c for c in self._retired | {channel} if not c.endpoint.closed}

    # --- the serving side

    def computed(self, key) -> None:
        """``key``'s task finished on this worker: mark where its kernels end. Only the
        producer is then waited for before its bytes leave, not every kernel queued on
        the device since (distributed-ucxx synchronizes the whole default stream, so a
        chunk waits for whatever the sender computes next)."""
        import cupy

        event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record(cupy.cuda.Stream.null)
        self.produced[key] = event

    def released(self, key) -> None:
        self.produced.pop(key, None)

    async def _produced(self, values: dict) -> None:
        """Wait until the device values of ``values`` are made. A value computed here waits
        for its own event; one this worker did not compute (received whole, restored from
        host or disk, both complete when stored) waits for nothing."""
        await _wait_for([self.produced[k] for k in values if k in self.produced])

    async def _serve_endpoint(self, endpoint) -> None:
        try:
            while True:
                buffer = wire.control_buffer()
                await endpoint.recv(buffer)
                request = wire.unpack(buffer)
                if not wire.authentic(request, self.secret):
                    # not one of this cluster's workers: nothing is read, nothing answered
                    self.counters.refused += 1
                    logger.warning("data plane: a request without the cluster's secret; endpoint closed")
                    endpoint.abort()
                    return
                task = asyncio.ensure_future(self._serve(endpoint, request))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (upstream.ucx_error(), asyncio.CancelledError):
            return  # the receiver closed its endpoint, or this worker is closing

    def _at_limit(self, requester: str | None = None) -> bool:
        # Worker.get_data's rule: twice the limit for a requester on this worker's host
        return upstream.outgoing_at_limit(self.worker, requester)

    async def _serve(self, endpoint, request: dict) -> None:
        """Answer one request. Whatever fails before the reply is sent (reading the values:
        a restore from disk; describing them: serialization) is answered at once with a
        ``fallback`` naming the error, so the fetcher goes over the comm (or refetches)
        rather than wait out its timeout."""
        worker = self.worker
        request_id = request["id"]
        keys = [wire.key_in(k) for k in request["keys"]]
        slots = request.get("slots") or [None] * len(keys)
        reply_tag = wire.tag(request_id, 0)
        if self._at_limit(request.get("who")):
            await self._refuse(endpoint, request_id, slots, "busy")
            return
        upstream.outgoing_started(worker)
        total, start = 0, time.time()
        began = time.perf_counter()
        replied = False
        try:
            values = {k: worker.data[k] for k in keys if k in worker.data}
            read = time.perf_counter()
            total = sum(upstream.worker_key_nbytes(worker, k) for k in values)
            upstream.outgoing_bytes(worker, total)
            try:
                reply, frames, into = wire.describe_reply(values, slots, keys)
                warm = int(request.get("warm") or 0)
                if warm:
                    frames, reply["frames"] = self._warm_frame(warm, request.get("who"))
                message = wire.pack(wire.signed(reply, self.secret))
            except wire.TooLarge:
                replied = True
                await self._refuse(endpoint, request_id, slots, "fallback")
                return
            if any(device for device, _ in reply["frames"]) or any(wire.on_device(f) for f in into.values()):
                await self._produced(values)
            ready = time.perf_counter()
            # the slots first (their receives are posted: the bytes move at once), then the
            # reply, then what did not fit a slot; the values stay referenced until the
            # receiver has pulled every frame
            replied = True
            sends = [endpoint.send(into.get(i, wire.FILLER), tag=wire.slot_tag(request_id, i))
                     for i, slot in enumerate(slots) if slot]
            sends.append(endpoint.send(message, tag=reply_tag))
            sends += [endpoint.send(f, tag=wire.frame_tag(request_id, len(slots), i))
                      for i, (f, (_, n)) in enumerate(zip(frames, reply["frames"])) if n]
            await asyncio.gather(*sends)
            self.counters.served += 1
            self.counters.served_bytes += sum(n for _, n in reply["frames"]) + sum(
                wire.frame_bytes(f) for f in into.values())
            self.counters.serve_trace.append({"read": read - began, "produced": ready - read,
                                              "frames": time.perf_counter() - ready})
        except upstream.ucx_error() as e:
            logger.info("data plane: the receiver of %d keys went away: %s", len(keys), e)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 (answered: the fetcher goes over the comm)
            self.counters.serve_errors += 1
            logger.info("data plane: serving %d keys failed (%s: %s); the fetcher goes over the comm", len(keys),
                        type(e).__name__, e, exc_info=logger.isEnabledFor(logging.DEBUG))
            if not replied:
                try:
                    await self._refuse(endpoint, request_id, slots, "fallback", f"{type(e).__name__}: {e}")
                except upstream.ucx_error():
                    pass
        finally:
            upstream.outgoing_bytes(worker, -total)
            upstream.outgoing_finished(worker, upstream.transfer_entry(
                worker, "dataplane", {k: upstream.worker_key_nbytes(worker, k) for k in keys}, total, start, time.time()))

    def _warm_frame(self, nbytes: int, requester: str | None) -> tuple[list, list]:
        """The frame a warm-up request gets (:meth:`warm`): ``nbytes`` from this worker's pool,
        so that the requester's UCX opens the pool's CUDA IPC handle now, not inside its
        first exchange; and this worker warms its way to the requester in turn, where it
        has no endpoint there yet (the workers that started first knew no peer to warm)."""
        if requester and requester not in self._channels and requester != self.worker.address:
            self.warm_soon([requester])
        frame = _device_buffer(nbytes) if self.gpu else bytearray(nbytes)
        return [frame], [[self.gpu, nbytes]]

    async def _refuse(self, endpoint, request_id: int, slots: list, status: str, error: str | None = None) -> None:
        """Say ``status`` (busy, or fallback: the comm instead, with the ``error`` that made
        it where there was one), every posted slot filled."""
        message = {"status": status} if error is None else {"status": status, "error": error[:1000]}
        await asyncio.gather(endpoint.send(wire.pack(wire.signed(message, self.secret)),
                                           tag=wire.tag(request_id, 0)),
                             *(endpoint.send(wire.FILLER, tag=wire.slot_tag(request_id, i))
                               for i, slot in enumerate(slots) if slot))


async def _wait_for(events) -> None:
    # spin the loop for the first moments (most producers are done, or nearly), then poll
    spin_until = time.perf_counter() + READY_SPIN_S
    for event in events:
        while not event.done:
            await asyncio.sleep(0 if time.perf_counter() < spin_until else READY_POLL_S)


def _buffer(device: bool, nbytes: int):
    return _device_buffer(nbytes) if device else bytearray(nbytes)


def _cancel(futures) -> None:
    for future in futures:
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            future.exception()  # retrieved: a lost peer fails every pending receive at once


def _host_frame(frame):
    # a received host frame as NumPy reads it (a device frame is an rmm.DeviceBuffer)
    if isinstance(frame, bytearray):
        import numpy as np

        return np.frombuffer(frame, dtype=np.uint8)
    return frame
