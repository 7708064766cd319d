"""The UCXX transport: UCXX's core API on a UCX context and worker of its own, progressed
by UCXX's own thread, so that nothing of a step's transfer passes the worker's event loop.

A peer is reached by its UCX worker address (published through the scheduler); an
endpoint a peer is opened at the first send there and kept for the worker's life. A send
is a tagged send on that endpoint, a receive a tagged receive on this transport's UCX
worker into the buffer the step allocated (device memory from the worker's RMM pool, so
that UCX's CUDA IPC moves it device to device between processes of one host). UCX maps a
peer's device memory at its first transfer from it, not when the worker starts.

A receive from a peer whose endpoint reports an error fails at once; one from a peer this
worker never sent to waits for the scheduler's abort (a worker that leaves ends the
exchange's attempt on every step).
"""

from __future__ import annotations

import base64
import logging
import threading

from .transport import Pending, Transport, TransportError

logger = logging.getLogger("spillway.step")


class _Request(Pending):
    def __init__(self, request, peer: str, what: str, buffer, transport: UcxxTransport):
        self.request, self.peer, self.what = request, peer, what
        #: kept until UCX is done with it: a receive abandoned on an abort may still land
        self.buffer = buffer
        self.transport = transport

    def done(self) -> bool:
        if not self.request.completed:
            gone = self.transport.gone_why(self.peer)
            if gone is not None:
                raise TransportError(f"{self.what} {self.peer[:16]}: {gone}")
            return False
        try:
            self.request.check_error()
        except Exception as e:  # noqa: BLE001 (UCXX's errors: one line naming the peer)
            raise TransportError(f"{self.what} failed: {type(e).__name__}: {e}") from None
        return True


class UcxxTransport(Transport):
    kind = "ucxx"

    def __init__(self, gpu: bool):
        from spillway.upstream import ucxx_core

        core = ucxx_core()
        if core is None:
            raise TransportError("UCXX's core API is not there, or not of the shape spillway knows")
        self._core = core
        ucx_api = self._api = core.api
        self._context = ucx_api.UCXContext(feature_flags=(ucx_api.Feature.TAG, ucx_api.Feature.WAKEUP))
        self._worker = ucx_api.UCXWorker(self._context)
        if gpu:
            import cupy

            device = cupy.cuda.runtime.getDevice()
            self._worker.set_progress_thread_start_callback(core.device_context, cb_args=(device,))
        self._worker.start_progress_thread(polling_mode=False)
        self._address = base64.b64encode(self._worker.address.tobytes()).decode()
        self._lock = threading.RLock()
        self._endpoints: dict = {}
        #: requests of ended exchanges UCX may still write into (their buffers kept)
        self._abandoned: set = set()

    def address(self) -> str:
        return self._address

    def _endpoint(self, to: str):
        with self._lock:
            found = self._endpoints.get(to)
            if found is not None:
                return found
            address = self._api.UCXAddress.create_from_buffer(base64.b64decode(to))
            try:
                endpoint = self._api.UCXEndpoint.create_from_worker_address(self._worker, address, True)
            except Exception as e:  # noqa: BLE001
                raise TransportError(f"cannot open a UCXX endpoint to a peer: {type(e).__name__}: {e}") from None
            self._endpoints[to] = endpoint
            return endpoint

    def gone_why(self, peer: str) -> str | None:
        """Why ``peer`` is lost, None while its endpoint is up (or none was opened). Read,
        not called back: a close callback runs Python on UCXX's thread, which then waits
        for the interpreter's lock that stopping the thread holds."""
        endpoint = self._endpoints.get(peer)
        if endpoint is not None and not endpoint.alive:
            return "its UCX endpoint closed (the peer is gone)"
        return None

    def send(self, to: str, tag: int, buffer) -> Pending:
        request = self._endpoint(to).tag_send(self._core.Array(buffer), self._api.UCXXTag(tag))
        return _Request(request, to, "a send to", buffer, self)

    def recv(self, source: str, tag: int, buffer) -> Pending:
        request = self._worker.tag_recv(self._core.Array(buffer), self._api.UCXXTag(tag), self._api.UCXXTagMaskFull)
        return _Request(request, source, "a receive from", buffer, self)

    def forget(self, exchange: int, pending: list) -> None:
        # UCXX cancels no single request: a receive left posted may still land, into the
        # buffer kept here until it does
        with self._lock:
            self._abandoned = {p for p in self._abandoned if not p.request.completed}
            self._abandoned.update(p for p in pending if isinstance(p, _Request) and not p.request.completed)

    def close(self) -> None:
        with self._lock:
            endpoints = list(self._endpoints.values())
            self._endpoints.clear()
            self._abandoned.clear()
        try:
            self._worker.stop_progress_thread()
        except Exception:  # noqa: BLE001
            logger.debug("stopping the UCXX progress thread failed", exc_info=True)
        # UCX's objects go in the order they depend on one another, on this thread: the
        # endpoints (whose close would wait for progress the stopped thread no longer
        # makes, and whose close request a peer that closed first may free), the worker,
        # then its context; left to the collector, the context may go first, and the
        # worker's end then reads freed memory
        endpoints.clear()
        self._worker = None
        self._context = None
