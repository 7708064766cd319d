"""The scheduler's and the workers' HTTP servers: off when no dashboard is asked for, on
the cluster's host when one is.

distributed's scheduler starts its HTTP server (dashboard, ``/health``, Prometheus
metrics) whatever ``dashboard_address`` says: with ``None`` it listens on port 8787, or on
another port when 8787 is taken ("Port 8787 is already in use ... Hosting the HTTP server on
port N instead"), and ``dashboard=False`` only leaves the Bokeh pages out of it. The local
clusters here start a scheduler that builds the server's routes but never listens when the
dashboard is off (:func:`cluster_class`), and an address given as a port alone (``:8787``,
which distributed binds on every interface) is bound on the cluster's host
(:func:`dashboard_kwargs`). A port another process holds (the default 8787 where a
second cluster runs on the machine) becomes a free one before the scheduler starts
(:func:`free_dashboard_address`), without distributed's four-line warning.

Each worker, too, starts an HTTP server whatever it is told (``/metrics``, ``/health``, on
a port of its own: ``distributed.worker.http.routes`` empty still listens); where the
dashboard is off its nanny starts :class:`QuietWorker` instead, which listens on nothing
but its comm. Without a dashboard nothing reads those pages, and on a shared machine they
answer every local user (the service's cluster: issue 63).
"""

from __future__ import annotations

import errno
import socket

from .. import upstream
from spillway.options.settings import Options


def dashboard_kwargs(options: Options) -> dict:
    """The dashboard keywords of LocalCluster / LocalCUDACluster for ``options``.

    Off (``dashboard_address`` empty or None): ``dashboard_address=None`` and
    ``scheduler_kwargs={"dashboard": False}``, which :func:`cluster_class` reads as "no HTTP
    server" (except over WebSockets, whose connections the HTTP server carries)."""
    address = options.dashboard_address or None
    if address is None:
        return {"dashboard_address": None, "scheduler_kwargs": {"dashboard": False}}
    host, sep, port = address.rpartition(":")
    if sep and not host and options.interface is None and options.host:
        # a port alone: distributed would listen on 0.0.0.0; keep to the cluster's host
        address = f"{_bracketed(options.host)}:{port}"
    return {"dashboard_address": free_dashboard_address(address)}


def free_dashboard_address(address: str) -> str:
    """``address``, or the same host with port 0 (a free one, which the cluster's
    ``dashboard_link`` names) where another process listens on its port. distributed
    does the same when the bind fails, but warns in four lines at every cluster start
    while another cluster runs on the machine."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) == 0 or port_free(host.strip("[]") or "0.0.0.0", int(port)):
        return address
    return f"{host}:0"


def port_free(host: str, port: int) -> bool:
    """Whether a TCP listener could bind ``host:port`` now (as tornado binds it, with
    SO_REUSEADDR, so a port in TIME_WAIT counts as free). A host this machine cannot
    bind at all is left for the scheduler to refuse in its own words."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return True
    family, kind, proto, _, where = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(where)
        except OSError as e:
            return e.errno != errno.EADDRINUSE
    return True


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def http_server_off(kwargs: dict) -> bool:
    """Whether cluster keywords ``kwargs`` ask for a scheduler without an HTTP server."""
    protocol = kwargs.get("protocol") or ""
    return (kwargs.get("dashboard_address") is None
            and (kwargs.get("scheduler_kwargs") or {}).get("dashboard") is False
            and not protocol.startswith("ws"))


def cluster_class(base: type, kwargs: dict) -> type:
    """``base`` (LocalCluster, LocalCUDACluster) as is, or with a scheduler that serves no
    HTTP where ``kwargs`` turn the dashboard off."""
    if not http_server_off(kwargs):
        return base
    return _without_http(base)


_classes: dict[type, type] = {}


def _without_http(base: type) -> type:
    if base not in _classes:
        _classes[base] = upstream.with_scheduler_class(base, scheduler_without_http,
                                                       lambda: __getattr__("QuietWorker"))
    return _classes[base]


_scheduler = None


def scheduler_without_http() -> type:
    """distributed's Scheduler with the HTTP server's routes built but nothing listening."""
    global _scheduler
    if _scheduler is None:
        from distributed import Scheduler
        from distributed.http.routing import RoutingApplication

        class QuietScheduler(Scheduler):
            def start_http_server(self, routes, dashboard_address, default_port=0, ssl_options=None):
                # what Node.start_http_server sets up, less the listening socket; no
                # "dashboard" service, so clients and scheduler_info report none
                self.http_application = RoutingApplication(routes)
                self.http_server = None

        _scheduler = QuietScheduler
    return _scheduler


def _quiet_worker() -> type:
    from distributed import Worker
    from distributed.http.routing import RoutingApplication

    class QuietWorker(Worker):
        """distributed's Worker with the HTTP server's routes built but nothing listening."""

        def start_http_server(self, routes, dashboard_address, default_port=0, ssl_options=None):
            self.http_application = RoutingApplication(routes)
            self.http_server = None

    QuietWorker.__module__, QuietWorker.__qualname__ = __name__, "QuietWorker"
    return QuietWorker


_workers: dict[str, type] = {}


def __getattr__(name: str):
    # built on first use, so importing this module imports no distributed; a nanny names the
    # class by its import path to the worker process it starts
    if name == "QuietWorker":
        if name not in _workers:
            _workers[name] = _quiet_worker()
        return _workers[name]
    raise AttributeError(name)
