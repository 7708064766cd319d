"""One worker's end of the data plane: a UCXX listener that serves its chunks, and an
endpoint to each peer it fetches from, kept open for the worker's life.

A fetch is one request and its reply: the receiver posts the reply's receive and sends the
keys; the sender reads the values from its store, sends what they are (the reply) and then
every frame at once; the receiver allocates each device frame from its RMM resource (the
pool, the statistics and spill on demand that every allocation of the worker goes through)
and receives them all at once. The completion of the rendezvous is the acknowledgement:
there is no trailing "OK" as in distributed's gather, and no pooled comm to take and give
back. Several fetches share one endpoint, each under its own tags.

It keeps distributed's contract of ``get_data_from_worker``: ``{"status": "OK", "data"}``
(keys the sender no longer holds left out), ``{"status": "busy"}`` when the sender is at
its limit of transfers, and ``OSError`` when the peer is lost, so that the worker's state
machine retries, refetches or recomputes exactly as it does over its comm.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import statistics
import time

from . import wire

logger = logging.getLogger("spillway.dataplane")

#: seconds a reply may take to start: the sender may restore the values from host or disk
#: first. A peer that dies fails the fetch at once (UCX's endpoint error handling); this
#: bounds only a peer that hangs.
REPLY_TIMEOUT_S = 300.0
#: fetches and serves whose phases a plane keeps (the latest), for :meth:`Counters.phases`
TRACE_LENGTH = 4096
#: seconds the serving side waits for its producer's kernels while spinning the loop; past
#: it, it checks every :data:`READY_POLL_S`
READY_SPIN_S = 0.002
READY_POLL_S = 0.0002


def _device_buffer(nbytes: int):
    import rmm

    return rmm.DeviceBuffer(size=nbytes)


def _synchronize_default_stream() -> None:
    # what distributed-ucxx does before a device send and after allocating receive buffers:
    # UCX copies on its own streams and knows nothing of the producer's
    from ucxx._cuda_context import synchronize_default_stream

    synchronize_default_stream()


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
        #: requests dropped for lacking the cluster's secret
        self.refused = 0
        #: values that went into a receive posted before the request
        self.slotted = 0
        self.fetch_trace: collections.deque = collections.deque(maxlen=TRACE_LENGTH)
        self.serve_trace: collections.deque = collections.deque(maxlen=TRACE_LENGTH)

    def phases(self) -> dict:
        """Median and total seconds of each phase over the kept fetches and serves."""
        out = {}
        for side, trace in (("fetch", self.fetch_trace), ("serve", self.serve_trace)):
            if not trace:
                continue
            for name in trace[0]:
                values = [t[name] for t in trace]
                out[f"{side}_{name}"] = {"median_s": statistics.median(values), "total_s": sum(values)}
        return out

    def as_dict(self) -> dict:
        out = {k: v for k, v in vars(self).items() if not k.endswith("_trace")}
        out["phases"] = self.phases()
        return out


class DataPlane:
    def __init__(self, worker, secret: str = ""):
        self.worker = worker
        #: the cluster's secret (:func:`.wire.authentic`): a request or reply without it is dropped
        self.secret = secret
        self.listener = None
        self.host = None
        self.counters = Counters()
        self._endpoints: dict[str, object] = {}
        self._connecting: dict[str, asyncio.Lock] = {}
        #: peer -> its contact ({"host", "port"}), or False for a peer without a plane
        self._contacts: dict[str, object] = {}
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task] = set()
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
        for endpoint in self._endpoints.values():
            endpoint.abort()
        self._endpoints.clear()
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    # --- the receiving side

    async def reaches(self, peer: str) -> bool:
        """Whether ``peer`` has a plane (asked once, over the worker's rpc)."""
        found = self._contacts.get(peer)
        if found is None:
            try:
                found = await self.worker.rpc(peer).dataplane_contact()
            except Exception:  # noqa: BLE001 (a peer without the handler: the comm path)
                found = False
            self._contacts[peer] = found or False
        return bool(found)

    async def _endpoint(self, peer: str):
        import ucxx
        from distributed.comm.core import CommClosedError

        endpoint = self._endpoints.get(peer)
        if endpoint is not None and not endpoint.closed:
            return endpoint
        async with self._connecting.setdefault(peer, asyncio.Lock()):
            endpoint = self._endpoints.get(peer)
            if endpoint is None or endpoint.closed:
                contact = self._contacts[peer]
                try:
                    endpoint = await ucxx.create_endpoint(contact["host"], contact["port"])
                except Exception as e:  # noqa: BLE001
                    self._contacts.pop(peer, None)
                    raise CommClosedError(f"data plane: cannot reach {peer}: {type(e).__name__}: {e}") from e
                self._endpoints[peer] = endpoint
            return endpoint

    def _forget(self, peer: str) -> None:
        endpoint = self._endpoints.pop(peer, None)
        self._contacts.pop(peer, None)
        if endpoint is not None:
            endpoint.abort()

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
        state = self.worker.state.tasks.get(keys[0])
        nbytes = int(state.nbytes or 0) if state is not None else 0
        return [[self.gpu, nbytes] if nbytes > 0 else None]

    async def fetch(self, peer: str, keys) -> dict | None:
        """``keys`` from ``peer``, as ``get_data_from_worker`` returns them; None where the
        request must go over the comm instead (too many keys for one control message)."""
        import ucxx
        from distributed.comm.core import CommClosedError

        keys = list(keys)
        slots = self._slots(keys)
        try:
            request_id = next(self._ids)
            request = wire.pack(wire.signed({"id": request_id, "keys": [wire.key_out(k) for k in keys],
                                             "slots": slots}, self.secret))
        except wire.TooLarge:
            self.counters.fallbacks += 1
            return None
        endpoint = await self._endpoint(peer)
        started = time.perf_counter()
        pending: list[asyncio.Future] = []
        try:
            async with asyncio.timeout(REPLY_TIMEOUT_S):
                slotted = [_buffer(*slot) if slot else None for slot in slots]
                if any(slot and slot[0] for slot in slots):
                    # the pool may hand out memory that kernels queued on this device still
                    # use (stream-ordered frees); UCX writes on streams of its own
                    _synchronize_default_stream()
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
                    return None
                described = reply["frames"]
                frames = [_buffer(device, n) for device, n in described]
                if any(device for device, _ in described):
                    _synchronize_default_stream()
                allocated = time.perf_counter()
                pending += [asyncio.ensure_future(endpoint.recv(f, tag=wire.frame_tag(request_id, len(slots), i)))
                            for i, (f, (_, n)) in enumerate(zip(frames, described)) if n]
                await asyncio.gather(*pending)
        except (ucxx.exceptions.UCXError, TimeoutError) as e:
            self.counters.lost += 1
            _cancel(pending)
            self._forget(peer)
            raise CommClosedError(f"data plane: lost {peer}: {type(e).__name__}: {e}") from e
        except BaseException:
            _cancel(pending)
            self._forget(peer)  # cancelled mid-request: the endpoint's pending tags are in doubt
            raise
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
        import ucxx

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
        except (ucxx.exceptions.UCXError, asyncio.CancelledError):
            return  # the receiver closed its endpoint, or this worker is closing

    def _at_limit(self) -> bool:
        # Worker.get_data's rule; the plane serves peers of this host only (CUDA IPC), whose
        # limit distributed doubles
        worker = self.worker
        limit = 1 if worker.status.name == "paused" else 2 * worker.transfer_outgoing_count_limit
        return worker.transfer_outgoing_count >= limit

    async def _serve(self, endpoint, request: dict) -> None:
        import ucxx

        worker = self.worker
        request_id = request["id"]
        keys = [wire.key_in(k) for k in request["keys"]]
        slots = request.get("slots") or [None] * len(keys)
        reply_tag = wire.tag(request_id, 0)
        if self._at_limit():
            await self._refuse(endpoint, request_id, slots, "busy")
            return
        worker.transfer_outgoing_count += 1
        worker.transfer_outgoing_count_total += 1
        total, start = 0, time.time()
        began = time.perf_counter()
        try:
            values = {k: worker.data[k] for k in keys if k in worker.data}
            read = time.perf_counter()
            total = sum(_nbytes(worker, k) for k in values)
            worker.transfer_outgoing_bytes += total
            worker.transfer_outgoing_bytes_total += total
            try:
                reply, frames, into = wire.describe_reply(values, slots, keys)
                message = wire.pack(wire.signed(reply, self.secret))
            except wire.TooLarge:
                await self._refuse(endpoint, request_id, slots, "fallback")
                return
            if any(device for device, _ in reply["frames"]) or any(wire.on_device(f) for f in into.values()):
                await self._produced(values)
            ready = time.perf_counter()
            # the slots first (their receives are posted: the bytes move at once), then the
            # reply, then what did not fit a slot; the values stay referenced until the
            # receiver has pulled every frame
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
        except ucxx.exceptions.UCXError as e:
            logger.info("data plane: the receiver of %d keys went away: %s", len(keys), e)
        finally:
            worker.transfer_outgoing_bytes -= total
            worker.transfer_outgoing_count -= 1
            stop = time.time()
            delay = worker.scheduler_delay
            worker.transfer_outgoing_log.append({
                "start": start + delay, "stop": stop + delay, "middle": (start + stop) / 2 + delay,
                "duration": stop - start, "who": "dataplane", "keys": {k: _nbytes(worker, k) for k in keys},
                "total": total, "compressed": None, "bandwidth": total / max(stop - start, 1e-6)})

    async def _refuse(self, endpoint, request_id: int, slots: list, status: str) -> None:
        """Say ``status`` (busy, or fallback: the comm instead), every posted slot filled."""
        await asyncio.gather(endpoint.send(wire.pack(wire.signed({"status": status}, self.secret)),
                                           tag=wire.tag(request_id, 0)),
                             *(endpoint.send(wire.FILLER, tag=wire.slot_tag(request_id, i))
                               for i, slot in enumerate(slots) if slot))


async def _wait_for(events) -> None:
    # spin the loop for the first moments (most producers are done, or nearly), then poll
    spin_until = time.perf_counter() + READY_SPIN_S
    for event in events:
        while not event.done:
            await asyncio.sleep(0 if time.perf_counter() < spin_until else READY_POLL_S)


def _nbytes(worker, key) -> int:
    state = worker.state.tasks.get(key)
    return int(state.nbytes or 0) if state is not None else 0


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
