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
from typing import Any

from spillway.cluster.errors import OptionsError


def _response(status: bytes, text: bytes, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: " + str(len(text)).encode() + b"\r\nconnection: close\r\n" + extra + b"\r\n" + text)


REFUSED = _response(b"503 Service Unavailable", b"too many connections from this address or in all; retry later\n",
                    b"retry-after: 1\r\n")
HEADER_TIMEOUT = _response(b"408 Request Timeout", b"request headers not received within the service's deadline\n")


class ConnectionStats:
    """The guard's counts, shared by every connection of one server (and read by
    ``/metrics``): open connections counted against the caps, by address; those waiting
    for their headers, oldest first; and what was refused, evicted or timed out."""

    __slots__ = ("total", "exempt", "by_addr", "waiting", "refused_client", "refused_total", "evicted",
                 "timed_out")

    def __init__(self) -> None:
        self.total = 0
        self.exempt = 0
        self.by_addr: dict[str, int] = {}
        self.waiting: dict[Any, None] = {}
        self.refused_client = 0
        self.refused_total = 0
        self.evicted = 0
        self.timed_out = 0

    def as_dict(self) -> dict[str, int]:
        return {"open": self.total, "open_exempt": self.exempt, "waiting_for_headers": len(self.waiting),
                "clients": len(self.by_addr), "refused_client_cap": self.refused_client,
                "refused_total_cap": self.refused_total, "evicted": self.evicted,
                "header_timeouts": self.timed_out}


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
    exempt: Exempt = Exempt()
    stats: ConnectionStats

    _guard_timer: asyncio.TimerHandle | None = None
    _guard_addr: str | None = None  # the address this connection is counted under
    _guard_refused = False
    _guard_exempt = False

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
        self._guard_arm()

    def _guard_refuse(self, transport) -> None:
        self._guard_refused = True
        transport.write(REFUSED)
        transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._guard_refused:
            return  # never started: uvicorn's state for it was never set up
        self._guard_cancel()
        self._guard_release()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._guard_refused:
            return
        if self._guard_timer is None and self._guard_idle():
            self._guard_arm()  # the first byte of the next request starts its deadline
        cycle = self.cycle  # type: ignore[attr-defined]
        super().data_received(data)  # type: ignore[misc]
        if self.cycle is not cycle:  # type: ignore[attr-defined]
            self._guard_cancel()  # a request's headers are complete

    def handle_websocket_upgrade(self, *args):
        # the connection moves to the WebSocket protocol, whose connection_lost is not ours
        self._guard_cancel()
        self._guard_release()
        return super().handle_websocket_upgrade(*args)  # type: ignore[misc]

    # -- the deadline

    def _guard_idle(self) -> bool:
        cycle = self.cycle  # type: ignore[attr-defined]
        return cycle is None or cycle.response_complete

    def _guard_arm(self) -> None:
        self._guard_timer = self.loop.call_later(self.header_timeout, self._guard_expired)  # type: ignore[attr-defined]
        if self._guard_addr is not None:  # counted connections only: exempt ones are never evicted
            self.stats.waiting[self] = None

    def _guard_cancel(self) -> None:
        if self._guard_timer is not None:
            self._guard_timer.cancel()
            self._guard_timer = None
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
        self._guard_cancel()
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
        "max_total": int(limits.max_connections), "exempt": Exempt(limits.trusted_proxies), "stats": stats})


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
