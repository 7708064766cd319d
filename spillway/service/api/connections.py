"""What one client may hold of the service before it has sent a request: a deadline on the
request's headers and caps on connections, per client address and in all.

uvicorn (0.54) never closes a connection that has not completed its headers: its
``timeout_keep_alive`` is armed only after a response and cancelled by the next byte
received, and its ``limit_concurrency`` answers 503 only once headers are complete (and
counts the slow connections, so it refuses the health checks rather than the slow
clients). The audit of issue 45 held 19,333 of the service's 20,000 file descriptors with
half-sent requests, with no token. The measurements that chose this design over hypercorn,
granian, gunicorn and a reverse proxy alone are in the README ("What one client may hold").

:func:`guarded_protocol` returns a subclass of uvicorn's HTTP/1.1 protocol (httptools, or
h11 where httptools is missing) to pass as ``uvicorn.run(http=...)``. Per connection:

* **header deadline** (``--header-timeout``): a timer armed when the connection is made,
  and again on the first byte of a next request on a kept-alive connection; cancelled when
  a request's headers are complete. It is one deadline for the whole header block, not per
  read, so dribbling bytes does not extend it. On expiry the client gets ``408`` and the
  connection is closed; unless a response is still being produced (pipelined bytes wait
  unread behind it), when it looks again later. The body is :mod:`.limits`' business.
* **caps** (``--max-connections-per-client``, ``--max-connections``): in
  ``connection_made``, before anything is read, an address that holds its cap gets
  ``503`` and the connection is closed at once. At the total cap the oldest connection
  still waiting for its headers is evicted (503) to admit the newcomer, so a client that
  sends its request promptly still gets in; only when every connection is busy with a
  real request is the newcomer refused.
* **trusted proxies** (``--trusted-proxy``, addresses or networks) are neither capped nor
  counted, but keep the deadline: behind a proxy every client has the proxy's address.

The counts (:class:`ConnectionStats`) are on ``/metrics``. With TLS, the loop calls
``connection_made`` only after the handshake, which is bounded by the loop's own
``ssl_handshake_timeout`` (60 s) and not counted here: terminate TLS at a proxy where that
matters.
"""

from __future__ import annotations

import asyncio
import ipaddress
import resource
import socket
from typing import Any

from spillway.options.errors import OptionsError


def _response(status: bytes, text: bytes, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: " + str(len(text)).encode() + b"\r\nconnection: close\r\n" + extra + b"\r\n" + text)


REFUSED = _response(b"503 Service Unavailable", b"too many connections from this address or in all; retry later\n",
                    b"retry-after: 1\r\n")
HEADER_TIMEOUT = _response(b"408 Request Timeout", b"request headers not received within the service's deadline\n")
#: bytes of answers the service buffers for one connection before it waits for the client
WRITE_HIGH_WATER = 16 * 2**10
#: the kernel's send buffer of a connection (Linux doubles it): 64 KiB a round trip is
#: enough for the API's JSON answers, and a slow reader pins no more of the kernel's memory
SEND_BUFFER = 32 * 2**10
#: requests one connection may send ahead of their answers (HTTP/1.1 pipelining)
MAX_PIPELINED = 32
HEADERS_TOO_LARGE = _response(b"431 Request Header Fields Too Large",
                              b"request line and headers longer than the service's limit\n")


class ConnectionStats:
    """The guard's counts, shared by every connection of one server (and read by
    ``/metrics``): open connections counted against the caps, by address; those waiting
    for their headers, oldest first; and what was refused, evicted or timed out."""

    __slots__ = ("total", "exempt", "by_addr", "waiting", "refused_client", "refused_total", "evicted",
                 "timed_out", "headers_too_large", "write_timeouts", "pipelined", "_trim")

    def __init__(self) -> None:
        self.total = 0
        self.exempt = 0
        self.by_addr: dict[str, int] = {}
        self.waiting: dict[Any, None] = {}
        self.refused_client = 0
        self.refused_total = 0
        self.evicted = 0
        self.timed_out = 0
        self.headers_too_large = 0
        self.write_timeouts = 0
        self.pipelined = 0
        self._trim: asyncio.TimerHandle | None = None

    def as_dict(self) -> dict[str, int]:
        return {"open": self.total, "open_exempt": self.exempt, "waiting_for_client": len(self.waiting),
                "clients": len(self.by_addr), "refused_client_cap": self.refused_client,
                "refused_total_cap": self.refused_total, "evicted": self.evicted,
                "header_timeouts": self.timed_out, "headers_too_large": self.headers_too_large,
                "write_timeouts": self.write_timeouts, "pipelined_dropped": self.pipelined}

    def trim_soon(self, loop) -> None:
        """Hand freed heap back to the system a moment after dropped connections freed their
        buffers (once for a burst of them): glibc keeps freed small blocks in its arenas,
        which is how 1,088 slow readers left the API at 913 MiB after they were gone."""
        if self._trim is None:
            self._trim = loop.call_later(1.0, self._trim_now)

    def _trim_now(self) -> None:
        self._trim = None
        malloc_trim()


def malloc_trim() -> None:
    """glibc's ``malloc_trim(0)``; nothing elsewhere."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


class Exempt:
    """Addresses and networks (``--trusted-proxy``) that the caps do not count."""

    def __init__(self, specs=()):
        self.networks = []
        for spec in specs:
            try:
                self.networks.append(ipaddress.ip_network(str(spec).strip(), strict=False))
            except ValueError:
                raise OptionsError(f"trusted-proxy: {spec!r} is not an IP address or network "
                                   "(10.0.0.5, 10.0.0.0/24, ::1)") from None
        self._seen: dict[str, bool] = {}

    def __bool__(self) -> bool:
        return bool(self.networks)

    def __contains__(self, addr: str) -> bool:
        if not self.networks:
            return False
        found = self._seen.get(addr)
        if found is None:
            try:
                ip = ipaddress.ip_address(addr)
            except ValueError:
                found = False
            else:
                found = any(ip in net for net in self.networks)
            if len(self._seen) < 65536:  # a bounded memo: a flood of addresses costs no memory
                self._seen[addr] = found
        return found


class GuardMixin:
    """The deadline and caps, over uvicorn's ``HttpToolsProtocol`` or ``H11Protocol``: it
    uses only their ``connection_made``, ``connection_lost``, ``data_received``,
    ``handle_websocket_upgrade``, ``cycle``, ``transport``, ``loop`` and ``server_state``."""

    header_timeout: float = 10.0
    max_per_client: int = 64
    max_total: int = 1024
    write_timeout: float = 30.0
    max_header_bytes: int = 32 * 2**10
    exempt: Exempt = Exempt()
    stats: ConnectionStats

    _guard_timer: asyncio.TimerHandle | None = None
    _guard_addr: str | None = None  # the address this connection is counted under
    _guard_refused = False
    _guard_exempt = False
    _guard_header_bytes = 0  # bytes of the current request's line and headers so far
    _guard_tail = b""  # the last bytes read while in them
    _guard_body = False  # a request's body is still arriving (evictable meanwhile)
    _guard_write_timer: asyncio.TimerHandle | None = None  # the client has stopped reading

    # -- connection life

    def connection_made(self, transport) -> None:  # type: ignore[override]
        stats = self.stats
        peer = transport.get_extra_info("peername")
        addr = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else "unix"
        if addr in self.exempt:
            self._guard_exempt = True
            stats.exempt += 1
        else:
            held = stats.by_addr.get(addr, 0)
            if held >= self.max_per_client:
                stats.refused_client += 1
                return self._guard_refuse(transport)
            if stats.total >= self.max_total and not self._guard_evict_oldest(stats):
                stats.refused_total += 1
                return self._guard_refuse(transport)
            stats.by_addr[addr] = held + 1
            stats.total += 1
            self._guard_addr = addr
        super().connection_made(transport)  # type: ignore[misc]
        # a client that stops reading holds at most this much of its answers in the service
        # (past it the answer waits, on the write deadline); asyncio's default is 64 KiB
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # and at most this much in the kernel: loopback's autotuning grants megabytes a
            # connection, which a thousand slow readers would hold
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            except (OSError, AttributeError):
                pass
        self._guard_arm()

    def _guard_forget(self) -> None:
        """Drop every entry of this connection from the books, whatever state it ended in
        (headers, a body cut at its deadline, an unread answer, evicted): the ``waiting``
        entry of a body cut at its deadline was kept for good, 3,023 of them after three
        rounds of slow bodies, each holding its protocol and buffers."""
        self._guard_cancel()
        self._guard_unpause()
        self._guard_body = False
        self.stats.waiting.pop(self, None)
        self._guard_release()

    def _guard_refuse(self, transport) -> None:
        self._guard_refused = True
        transport.write(REFUSED)
        transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._guard_refused:
            return  # never started: uvicorn's state for it was never set up
        self._guard_forget()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._guard_refused:
            return
        if self._guard_timer is None and self._guard_idle():
            self._guard_arm()  # the first byte of the next request starts its deadline
        in_headers = self._guard_timer is not None
        if in_headers:
            self._guard_header_bytes += len(data)
            # the end of the headers may straddle two reads
            ended = b"\r\n\r\n" in self._guard_tail + data[:3] or b"\r\n\r\n" in data
            self._guard_tail = data[-3:]
            if self._guard_header_bytes > self.max_header_bytes and not ended:
                return self._guard_too_large()  # not even parsed: an endless header line costs nothing
        cycle = self.cycle  # type: ignore[attr-defined]
        super().data_received(data)  # type: ignore[misc]
        if self.cycle is not cycle:  # type: ignore[attr-defined]
            self._guard_cancel()  # a request's headers are complete
        elif in_headers and self._guard_header_bytes > self.max_header_bytes and self._guard_timer is not None:
            return self._guard_too_large()
        if len(getattr(self, "pipeline", ())) > MAX_PIPELINED:
            # requests sent ahead of their answers, each a request held in memory: a client
            # that sends hundreds and reads none is not a client to keep
            self.stats.pipelined += 1
            return self._guard_drop()
        self._guard_body_state()

    def _guard_too_large(self) -> None:
        self.stats.headers_too_large += 1
        self._guard_close(HEADERS_TOO_LARGE)

    def _guard_body_state(self) -> None:
        """A request whose body is still arriving waits on its client as one sending headers
        does: the body has its own deadline (:mod:`.limits`), and meanwhile the connection may
        be evicted at the total cap, so slow bodies (read before any token is checked) cannot
        hold every slot and refuse everyone else."""
        cycle = self.cycle  # type: ignore[attr-defined]
        receiving = (cycle is not None and getattr(cycle, "more_body", False)
                     and not getattr(cycle, "response_complete", True) and not getattr(cycle, "disconnected", False))
        if receiving and not self._guard_body and self._guard_addr is not None:
            self._guard_body = True
            self.stats.waiting[self] = None
        elif not receiving and self._guard_body:
            self._guard_body = False
            if self._guard_timer is None and self._guard_write_timer is None:
                self.stats.waiting.pop(self, None)

    # -- the write deadline

    def pause_writing(self) -> None:
        """The transport's buffer passed its high-water mark: the client is not reading. It
        has ``write_timeout`` seconds to read it down below the low-water mark; meanwhile the
        connection may be evicted at the total cap."""
        super().pause_writing()  # type: ignore[misc]
        if self._guard_write_timer is None and not self._guard_refused:
            self._guard_write_timer = self.loop.call_later(  # type: ignore[attr-defined]
                self.write_timeout, self._guard_write_expired)
            if self._guard_addr is not None:
                self.stats.waiting[self] = None

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        self._guard_unpause()

    def _guard_unpause(self) -> None:
        if self._guard_write_timer is not None:
            self._guard_write_timer.cancel()
            self._guard_write_timer = None
            if self._guard_timer is None and not self._guard_body:
                self.stats.waiting.pop(self, None)

    def _guard_write_expired(self) -> None:
        self._guard_write_timer = None
        self.stats.waiting.pop(self, None)
        self.stats.write_timeouts += 1
        self._guard_drop()

    def _guard_drop(self) -> None:
        """Close without a word (an answer is half sent) and free what waits in the buffer."""
        transport = self.transport  # type: ignore[attr-defined]
        if transport is not None and not transport.is_closing():
            transport.abort()
        self.stats.trim_soon(self.loop)  # type: ignore[attr-defined]

    def handle_websocket_upgrade(self, *args):
        # the connection moves to the WebSocket protocol, whose connection_lost is not ours
        self._guard_forget()
        return super().handle_websocket_upgrade(*args)  # type: ignore[misc]

    # -- the deadline

    def _guard_idle(self) -> bool:
        cycle = self.cycle  # type: ignore[attr-defined]
        return cycle is None or cycle.response_complete

    def _guard_arm(self) -> None:
        self._guard_header_bytes, self._guard_tail = 0, b""
        self._guard_timer = self.loop.call_later(self.header_timeout, self._guard_expired)  # type: ignore[attr-defined]
        if self._guard_addr is not None:  # counted connections only: exempt ones are never evicted
            self.stats.waiting[self] = None

    def _guard_cancel(self) -> None:
        if self._guard_timer is not None:
            self._guard_timer.cancel()
            self._guard_timer = None
            if not self._guard_body and self._guard_write_timer is None:
                self.stats.waiting.pop(self, None)

    def _guard_expired(self) -> None:
        self._guard_timer = None
        self.stats.waiting.pop(self, None)
        transport = self.transport  # type: ignore[attr-defined]
        if transport.is_closing() or transport.get_protocol() is not self:
            return
        if not self._guard_idle():
            # a response is still being produced (pipelined bytes wait unread behind it):
            # the server, not the client, is the slow one; look again later
            self._guard_arm()
            return
        self.stats.timed_out += 1
        self._guard_close(HEADER_TIMEOUT)

    def _guard_close(self, response: bytes) -> None:
        transport = self.transport  # type: ignore[attr-defined]
        if self._guard_write_timer is not None:
            return self._guard_drop()  # an answer is half sent: no other may follow it
        self._guard_cancel()
        self._guard_body = False
        if not transport.is_closing():
            transport.write(response)
            transport.close()

    def _guard_evict_oldest(self, stats: ConnectionStats) -> bool:
        while stats.waiting:
            oldest = next(iter(stats.waiting))
            stats.waiting.pop(oldest)
            if oldest.transport is None or oldest.transport.is_closing():
                continue
            stats.evicted += 1
            oldest._guard_close(REFUSED)
            # its slot frees when connection_lost runs; counted free now so the newcomer fits
            oldest._guard_release()
            return True
        return False

    def _guard_release(self) -> None:
        if self._guard_exempt:
            self._guard_exempt = False
            self.stats.exempt -= 1
            return
        addr = self._guard_addr
        if addr is None:
            return
        self._guard_addr = None
        stats = self.stats
        stats.total -= 1
        left = stats.by_addr[addr] - 1
        if left:
            stats.by_addr[addr] = left
        else:
            del stats.by_addr[addr]


def base_protocol() -> type:
    """uvicorn's httptools protocol (``uvicorn[standard]``), or its h11 one without httptools."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:  # pragma: no cover (the service extra installs httptools)
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol


def guarded_protocol(limits, stats: ConnectionStats, base: type | None = None) -> type:
    """``uvicorn.run(app, http=guarded_protocol(limits, stats))``: ``base`` (see
    :func:`base_protocol`) with the header deadline and the caps of ``limits`` (a
    :class:`~.settings.ServiceLimits`), counting into ``stats``."""
    base = base or base_protocol()
    return type(f"Guarded{base.__name__}", (GuardMixin, base), {
        "header_timeout": float(limits.header_timeout_s), "max_per_client": int(limits.max_connections_per_client),
        "max_total": int(limits.max_connections), "write_timeout": float(limits.write_timeout_s),
        "max_header_bytes": int(limits.max_header_bytes), "exempt": Exempt(limits.trusted_proxies),
        "stats": stats})


def raise_fd_limit(max_connections: int) -> tuple[int, int]:
    """Raise this process's soft file-descriptor limit to its hard limit, and check that
    ``max_connections`` stays below half of it: the other half is the job database's pool,
    the Dask scheduler's and clients' comms, and the files of running jobs. Returns
    (soft, hard) as set; OptionsError where the cap does not fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    if 2 * max_connections >= soft:
        raise OptionsError(f"max-connections: {max_connections} must stay below half of this process's "
                           f"file-descriptor limit ({soft}, hard limit {hard}); lower --max-connections or "
                           f"raise the limit (ulimit -n, LimitNOFILE= in the systemd unit)")
    return soft, hard
