"""How an exchange's steps move their buffers between workers: a transport a worker,
driven from the step's own thread, never from the worker's event loop.

A transport sends a whole buffer to a peer under a 64-bit tag and receives a whole buffer
of a size the receiver knows (both ends work it out from the plan: :mod:`.layout`), into
memory the receiver allocated. Each call returns a :class:`Pending` at once; :func:`wait`
waits for several, and gives up on an abort (the scheduler said a worker left), a peer
lost, or a deadline.

The kinds (:data:`KINDS`, each a module of this package):

- ``ipc``: no messages at all: between GPU workers of one host a step's one kernel writes
  its pieces straight into its peers' output chunks, mapped over CUDA IPC (:mod:`.ipc`).
  Chosen where every step offers it on one host; the buffered kinds below move what it
  cannot reach.
- ``ucxx``: UCXX's core API on a UCX context and worker of the transport's own, with a
  progress thread: device buffers over CUDA IPC between processes on one host (two
  workers on one GPU too) and over the network between hosts, host buffers over shared
  memory or TCP. Chosen where every step of an exchange offers it.
- ``host``: a TCP connection a peer, a thread each end; device buffers are staged
  through host memory. What CPU workers use, and every worker's fallback.

NCCL is not one of them yet: it refuses two workers on one GPU, the only kind of
several workers the hosts lent so far had, and so could not be run here.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod

from spillway.options.errors import SpillwayError

#: the kinds in the order an exchange prefers them (every step offers ``host``)
KINDS = ("ipc", "ucxx", "host")
#: the kinds that write into peers' memory rather than send messages, and reach only the
#: workers of one GPU (every step's offer of one is its host's and GPU's identity)
PUT_KINDS = ("ipc",)
#: the kinds ``exchange-transport: auto`` offers, in order (CUDA IPC where the steps share
#: a GPU: 4.9x the copy bound at W3 48000² on an H100 where UCXX took 6.0x, 2026-12-06)
AUTO_KINDS = ("ipc", "ucxx", "host")


class TransportError(SpillwayError, ConnectionError):
    """A peer is gone, or a send or receive failed: one line naming the peer."""


class StepAborted(SpillwayError, RuntimeError):
    """The scheduler ended this attempt of the exchange (a worker left)."""


class Pending(ABC):
    """One send or receive in flight."""

    @abstractmethod
    def done(self) -> bool:
        """Whether it completed (a failure raises :class:`TransportError`)."""

    def finish(self) -> None:
        """Runs on the waiting thread once :meth:`done` is true (a staged receive copies
        to the device here)."""


class Transport(ABC):
    kind: str

    @abstractmethod
    def address(self) -> str:
        """What a peer reaches this transport by (published through the scheduler)."""

    def send(self, to: str, tag: int, buffer) -> Pending:
        raise TransportError(f"the {self.kind} kind writes into its peers' memory; it sends no messages")

    def recv(self, source: str, tag: int, buffer) -> Pending:
        raise TransportError(f"the {self.kind} kind writes into its peers' memory; it receives no messages")

    def forget(self, exchange: int, pending: list) -> None:
        """The exchange attempt ``exchange`` (its tags' bits from :data:`ATTEMPT_SHIFT`)
        ended with ``pending`` not done: what it posted and what of it arrives late is let
        go (a buffer the transport may still write into is kept until it is done with it)."""

    @abstractmethod
    def close(self) -> None: ...


def tag_of(exchange: int, round_: int, sender: int, receiver: int, message: int = 0) -> int:
    """The tag of message ``message`` that slot ``sender`` sends slot ``receiver`` in round
    ``round_`` of the exchange attempt ``exchange`` (its number, as the scheduler counts
    attempts): unique among a worker's receives whichever peer sends, several slots on one
    worker too."""
    if not (0 <= sender < 1 << SLOT_BITS and 0 <= receiver < 1 << SLOT_BITS and 0 <= round_ < 1 << ROUND_BITS
            and 0 <= message < 1 << MESSAGE_BITS):
        raise ValueError(f"slots {sender} and {receiver}, round {round_} or message {message} past the tag's "
                         f"room ({1 << SLOT_BITS:,} slots, {1 << ROUND_BITS} rounds, {1 << MESSAGE_BITS:,} "
                         f"messages)")
    return ((exchange & ((1 << EXCHANGE_BITS) - 1)) << ATTEMPT_SHIFT | round_ << (2 * SLOT_BITS + MESSAGE_BITS)
            | sender << (SLOT_BITS + MESSAGE_BITS) | receiver << MESSAGE_BITS | message)


#: the tag's fields: the exchange attempt, the round, the sending and receiving slots, the message
EXCHANGE_BITS, ROUND_BITS, SLOT_BITS, MESSAGE_BITS = 20, 8, 12, 12
#: the tag's bits above these name the exchange attempt (:meth:`Transport.forget`)
ATTEMPT_SHIFT = ROUND_BITS + 2 * SLOT_BITS + MESSAGE_BITS
#: rounds an exchange takes at most
MAX_ROUNDS = 1 << ROUND_BITS


#: seconds between looks at pending transfers: the first waits spin briefly (an in-memory
#: exchange's rounds end in milliseconds), later ones sleep up to the last
POLL_S = (0.00005, 0.0005, 0.002)


def wait(pending: list[Pending], *, aborted, deadline: float, what: str) -> None:
    """Wait for every ``pending``: :class:`StepAborted` where ``aborted()`` says why the
    exchange ended, :class:`TransportError` where a peer failed or ``deadline``
    (``time.monotonic()``) passed first."""
    left = list(pending)
    looks = 0
    while left:
        still = []
        for p in left:
            if p.done():
                p.finish()
            else:
                still.append(p)
        left = still
        if not left:
            return
        why = aborted()
        if why:
            raise StepAborted(why)
        if time.monotonic() > deadline:
            raise TransportError(f"{what}: {len(left)} transfer(s) still pending at the step's deadline")
        looks += 1
        time.sleep(POLL_S[min(looks // 200, len(POLL_S) - 1)])


class Staged(Pending):
    """A receive into host memory that lands in a device buffer when waited for."""

    def __init__(self, inner: Pending, host, device):
        self.inner, self.host, self.device = inner, host, device

    def done(self) -> bool:
        return self.inner.done()

    def finish(self) -> None:
        self.inner.finish()
        self.device.set(self.host)


class Flag(Pending):
    """A pending whose owner thread sets it done or failed."""

    def __init__(self):
        self._event = threading.Event()
        self.error: str | None = None

    def set(self, error: str | None = None) -> None:
        self.error = error
        self._event.set()

    def done(self) -> bool:
        if not self._event.is_set():
            return False
        if self.error is not None:
            raise TransportError(self.error)
        return True


def on_device(buffer) -> bool:
    return type(buffer).__module__.startswith("cupy")


def offered(setting: str, gpu: bool = False) -> tuple[str, ...]:
    """The kinds this worker offers an exchange under the option ``exchange-transport``
    (``auto``: :data:`AUTO_KINDS`, UCXX where it is installed; a put kind only for device
    arrays)."""
    if setting != "auto":
        if setting not in KINDS:
            raise ValueError(f"exchange-transport {setting!r} is not auto or one of {', '.join(KINDS)}")
        return tuple(k for k in dict.fromkeys((setting, "host")) if gpu or k not in PUT_KINDS)
    kinds = [k for k in AUTO_KINDS if gpu or k not in PUT_KINDS]
    try:
        import ucxx  # noqa: F401
    except ImportError:
        kinds.remove("ucxx")
    else:
        from spillway.upstream import usable

        if not usable("ucxx_core"):
            kinds.remove("ucxx")
    return tuple(kinds)


def chosen(offers: list[dict]) -> str:
    """The first kind, in :data:`KINDS` order, that every step offers (``offers``: each
    step's kind -> its address there); a put kind only where every step offers it at one
    address (one GPU, for CUDA IPC)."""
    for kind in KINDS:
        if not all(kind in o for o in offers):
            continue
        if kind in PUT_KINDS and len({o[kind] for o in offers}) != 1:
            continue
        return kind
    return "host"
