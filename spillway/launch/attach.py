"""The attach launcher: a running scheduler (:class:`Attach`, the backend of plans of kind
``attach``: nothing to start), the address the options name (or their scheduler file
holds), the TLS a client attaching there takes, and the refusals of an address that is no
dask scheduler, each in one line, before distributed's client waits out its timeout.

distributed's connect retries a refused connection until its timeout (30 s for one
refusal the kernel gave at once), and its client waits for the peer's handshake for ever:
a closed port, a stale scheduler file and a web server's port each cost the user the
whole attach timeout before a line that did not say which it was."""

from __future__ import annotations

import json
import socket

from spillway.options.errors import OptionsError
from spillway.options.settings import Options
from .plan import LaunchPlan
from .spec import WorkerSpec

class Attach:
    """Backend of plans of kind ``attach``: a running scheduler, nothing to start; the
    session's client connects to its address (``connect_client`` in :mod:`.session`, with
    this module's refusals)."""

    def start(self, options: Options, launch: LaunchPlan, specs: tuple[WorkerSpec, ...]) -> None:
        return None


#: seconds a client waits for a scheduler it attaches to
ATTACH_TIMEOUT_S = 30

#: seconds the TCP probe of an address waits: a refusal comes at once, and a host that
#: drops packets is left to the client's own timeout
PROBE_S = 2.0

#: seconds a scheduler has to send its handshake before the address is asked, on a second
#: connection, whether it is a web server (a scheduler answers within milliseconds; a web
#: server waits for a request line that distributed's binary handshake never sends)
SNIFF_AFTER_S = 1.0


def file_address(path: str) -> str | None:
    """The address a scheduler file holds, or None where distributed should say what is
    wrong with the file itself."""
    try:
        with open(path) as f:
            address = json.load(f)["address"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return address if isinstance(address, str) else None


def attach_security(options: Options):
    """The TLS of a client attaching: the options' files, else those a scheduler file names
    (``spillway serve`` writes its cluster's, readable by its owner only, beside the address)."""
    if options.tls_ca_file or not options.scheduler_file:
        return options.dask_security

    from spillway.options.settings import tls_security

    try:
        with open(options.scheduler_file) as f:
            tls = json.load(f).get("tls") or {}
    except (OSError, ValueError, AttributeError):
        return None  # distributed's own reading of the file says what is wrong with it
    return tls_security(tls.get("tls_ca_file"), tls.get("tls_cert"), tls.get("tls_key"))


def refuse_closed(where: str, address: str | None, *, scheduler_file: str | None = None) -> None:
    """A TCP (or TLS) address where nothing listens is refused at once, in one line: a
    closed port, or a scheduler file left by a cluster that ended. A host name that does not
    resolve is said at once too. Other protocols, an address that answers and one that does
    not answer within :data:`PROBE_S` go on to the client."""
    where_to = tcp_host_port(address)
    if where_to is None:
        return
    host, port = where_to
    try:
        socket.create_connection((host, port), timeout=PROBE_S).close()
    except ConnectionRefusedError:
        if scheduler_file:
            raise OptionsError(f"scheduler-file: {scheduler_file!r} names {address}, where nothing listens: the "
                               "file of a cluster that has ended? (start one with `spillway up`, or remove the "
                               "file)") from None
        raise OptionsError(f"{where} refused the connection: nothing listens on port {port} of {host} "
                           "(`spillway up` starts a cluster there)") from None
    except socket.gaierror as e:
        raise OptionsError(f"{where} did not answer: host {host!r} is not known ({e.strerror})") from None
    except OSError:
        return  # unreachable or slow: the client's own timeout says it


def refuse_non_scheduler(where: str, address: str | None, security, timeout: float = ATTACH_TIMEOUT_S) -> None:
    """Open one comm to ``address`` as the client will, within ``timeout`` seconds in all,
    and refuse in one line an address whose listener is not a dask scheduler.

    distributed's client bounds only the TCP connect by its timeout: its handshake then
    waits for the peer's first message for ever (a web server answers nothing until it
    has a request line), and decodes whatever comes as frames (bytes that are not
    distributed's had it allocate exabytes). A TCP listener silent after
    :data:`SNIFF_AFTER_S` is asked for ``/`` over HTTP on a connection of its own: one that
    answers HTTP is refused then, not at the timeout. Nothing listening, or an unreachable
    host, is said in distributed's words, once (the client would retry as long again)."""
    if not address:
        return
    import asyncio
    import concurrent.futures

    from distributed.comm import CommClosedError, connect

    async def handshake():
        args = security.get_connection_args("client") if security is not None else {}
        # a second past the connect's own retries, so that a timeout here is the handshake's
        comm = await asyncio.wait_for(connect(address, timeout=timeout, **args), timeout + 1)
        await comm.close()

    async def attach():
        shake = asyncio.ensure_future(handshake())
        done, _ = await asyncio.wait({shake}, timeout=min(SNIFF_AFTER_S, timeout / 2))
        if not done:
            # within what is left of the timeout: a silent listener is still refused at it
            status = await http_status(address, timeout=min(PROBE_S, timeout / 2))
            if status is not None:
                shake.cancel()
                raise NotAScheduler(status)
        await shake

    # in a thread of its own: the caller may be a notebook, whose thread runs a loop already
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spillway-attach") as pool:
        try:
            pool.submit(asyncio.run, attach()).result()
        except NotAScheduler as e:
            raise OptionsError(f"{where} is not a dask scheduler: it answers HTTP ({e}): a web server? the "
                               "dashboard's port?") from None
        except TimeoutError:  # before OSError, of which it is one
            raise OptionsError(f"{where} did not answer as a dask scheduler within {timeout:.0f} s: something "
                               "listens there but sent no handshake (a web server? the dashboard's port?)") from None
        except CommClosedError:  # the connect's retries end in a plain OSError: this is the handshake's
            raise OptionsError(f"{where} is not a dask scheduler: it closed the connection during distributed's "
                               "handshake (a web server? another service's port?)") from None
        except OSError as e:
            raise OptionsError(f"{where} did not answer: {first_line(e)}") from None
        except Exception as e:  # noqa: BLE001 - whatever the junk made the decoder raise
            raise OptionsError(f"{where} is not a dask scheduler: what it sent is not distributed's handshake "
                               f"({type(e).__name__}: {first_line(e)[:120]})") from None


class NotAScheduler(Exception):
    """The address answered HTTP: the status line it sent."""


async def http_status(address: str, timeout: float) -> str | None:
    """The status line a plain-TCP ``address`` answers ``GET /`` with, or None where it
    answers nothing within ``timeout`` s, or not HTTP (TLS addresses are not asked)."""
    import asyncio

    if not address.startswith("tcp://") and "://" in address:
        return None
    where_to = tcp_host_port(address)
    if where_to is None:
        return None
    host, port = where_to
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        writer.write(f"GET / HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n".encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
    except (OSError, asyncio.TimeoutError, ValueError):
        return None
    finally:
        if writer is not None:
            writer.close()
    text = line.decode("latin-1").strip()
    return text[:80] if text.startswith("HTTP/") else None


def tcp_host_port(address: str | None) -> tuple[str, int] | None:
    """The host and port of a TCP or TLS address as distributed reads it (no scheme: TCP),
    or None for other protocols and addresses it cannot read (it says why itself)."""
    if not address:
        return None
    from distributed.comm import parse_address, parse_host_port

    try:
        scheme, location = parse_address(address)
        host, port = parse_host_port(location)
    except ValueError:
        return None
    return (host, port) if scheme in ("tcp", "tls") and host and port else None


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
