"""The service's limits on requests and connections, each declared once with the
``spillway serve`` flag that sets it (the CLI makes its options from these fields): the
body's size and time (enforced by :mod:`.limits`), the header deadline and size, the write
deadline and the connection caps (enforced by :mod:`.connections`), failed authentication
per address (:mod:`.auth`).

Imports nothing of the web framework, so the CLI can read the flags cheaply.
"""

from __future__ import annotations

import dataclasses
import math

from spillway.options.errors import OptionsError
from spillway.options.sizes import parse_size
from .connections import Exempt

DEFAULT_MAX_REQUEST_BYTES = 2**20
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 64
DEFAULT_WRITE_TIMEOUT_S = 30.0
DEFAULT_MAX_HEADER_BYTES = 32 * 2**10
DEFAULT_AUTH_FAILURES = 30


def _setting(default, *, flag: str, help: str, shown=None, type=None, multiple: bool = False):
    """A field of :class:`ServiceLimits` with the ``spillway serve`` flag that sets it: the
    one declaration of the flag, its default and its help (``spillway/cli/serve.py`` makes
    the click options from these)."""
    env = "SPILLWAY_" + flag.lstrip("-").replace("-", "_").upper()
    meta = {"flag": flag, "help": help, "shown": default if shown is None else shown, "type": type,
            "multiple": multiple, "env": env}
    if multiple:
        return dataclasses.field(default_factory=tuple, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class ServiceLimits:
    """What a request, and a client, may cost the service (``spillway serve`` flags)."""

    max_request_bytes: int = _setting(
        DEFAULT_MAX_REQUEST_BYTES, flag="--max-request-bytes", shown="1MiB",
        help="Largest request body (bytes such as 1MiB); larger ones get 413 before they are read, "
             "parsed or authenticated.")
    body_timeout_s: float = _setting(
        DEFAULT_BODY_TIMEOUT_S, flag="--body-timeout", type=float,
        help="Seconds a client has to send a whole request body; slower ones get 408 and are closed.")
    header_timeout_s: float = _setting(
        DEFAULT_HEADER_TIMEOUT_S, flag="--header-timeout", type=float,
        help="Seconds a client has to send a request's headers, from connecting (or from the first "
             "byte of a next request); slower ones get 408 and are closed.")
    max_connections: int = _setting(
        DEFAULT_MAX_CONNECTIONS, flag="--max-connections", type=int,
        help="Connections the service holds at once (below half its file-descriptor limit, which it "
             "raises to the hard limit); past it the oldest one still sending headers is closed "
             "(503), or the newcomer when none is.")
    max_connections_per_client: int = _setting(
        DEFAULT_MAX_CONNECTIONS_PER_CLIENT, flag="--max-connections-per-client", type=int,
        help="Connections one client address may hold at once; more get 503 and are closed.")
    write_timeout_s: float = _setting(
        DEFAULT_WRITE_TIMEOUT_S, flag="--write-timeout", type=float,
        help="Seconds a client that stops reading may leave an answer unread (the service's send "
             "buffer full); past it the connection is dropped and its buffer freed.")
    max_header_bytes: int = _setting(
        DEFAULT_MAX_HEADER_BYTES, flag="--max-header-bytes", type=int,
        help="Largest request line and headers together, in bytes; more get 431 and are closed.")
    max_auth_failures: int = _setting(
        DEFAULT_AUTH_FAILURES, flag="--max-auth-failures", type=int,
        help="Requests with a wrong, revoked or expired token one client address may make in a "
             "minute; past it 429 with Retry-After, before the token is looked up.")
    trusted_proxies: tuple[str, ...] = _setting(
        (), flag="--trusted-proxy", multiple=True, shown=None,
        help="Address or network of a reverse proxy in front of the service (repeatable): its "
             "connections are not capped, and its X-Forwarded-For is believed.")

    def __post_init__(self):
        size = self.max_request_bytes
        if isinstance(size, str):
            try:
                size = parse_size(size, name="max-request-bytes", minimum=1)
            except ValueError as e:
                raise OptionsError(str(e)) from None
        if isinstance(size, bool) or not isinstance(size, int) or not 1024 <= size <= 2**30:
            raise OptionsError(f"max-request-bytes: {self.max_request_bytes!r} must be from 1KiB to 1GiB")
        object.__setattr__(self, "max_request_bytes", size)
        for name, flag in (("body_timeout_s", "body-timeout"), ("header_timeout_s", "header-timeout"),
                           ("write_timeout_s", "write-timeout")):
            value = getattr(self, name)
            try:
                timeout = float(value)
            except (TypeError, ValueError):
                raise OptionsError(f"{flag}: {value!r} is not a number of seconds") from None
            if not math.isfinite(timeout) or not 0.1 <= timeout <= 3600:
                raise OptionsError(f"{flag}: {value!r} must be from 0.1 to 3600 seconds")
            object.__setattr__(self, name, timeout)
        for name, flag, low, high in (("max_connections", "max-connections", 1, 10**6),
                                      ("max_connections_per_client", "max-connections-per-client", 1,
                                       self.max_connections),
                                      ("max_header_bytes", "max-header-bytes", 1024, 2**20),
                                      ("max_auth_failures", "max-auth-failures", 1, 10**6)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise OptionsError(f"{flag}: {value!r} must be a whole number from {low} to {high}")
        proxies = tuple(str(p) for p in self.trusted_proxies)
        Exempt(proxies)  # refuses what is not an address or a network
        object.__setattr__(self, "trusted_proxies", proxies)


def setting_fields() -> tuple[dataclasses.Field, ...]:
    """The fields of :class:`ServiceLimits`, each with its flag's metadata."""
    return dataclasses.fields(ServiceLimits)
