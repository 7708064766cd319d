"""The host transport: one TCP connection a peer, a thread each end.

A sender opens a connection to a peer the first time it sends there (keeping it for the
worker's life), says who it is, then writes each buffer behind a 16-byte header (tag,
bytes) from a thread of that connection's own. The receiving end reads headers on a thread
a connection and each payload straight into the buffer the step posted for that tag
(``recv_into``: no copy of its own); a payload that comes before its buffer was posted
waits for it. A device buffer is staged through host memory on either side.

A connection that closes fails every receive posted from its peer and every send queued
to it, at once: a worker that dies ends its peers' steps within the time the kernel takes
to reset the connection.
"""

from __future__ import annotations

import collections
import logging
import queue
import socket
import struct
import threading

from .transport import ATTEMPT_SHIFT, Flag, Pending, Staged, Transport, TransportError, on_device

logger = logging.getLogger("spillway.step")

_HEADER = struct.Struct("<QQ")
_HELLO = struct.Struct("<H")
#: seconds a connection to a peer may take to come up
CONNECT_TIMEOUT_S = 10.0


def _host_view(buffer):
    import numpy as np

    return memoryview(np.ascontiguousarray(buffer).reshape(-1).view(np.uint8))


class _Posted:
    def __init__(self, source: str, view: memoryview, flag: Flag):
        self.source, self.view, self.flag = source, view, flag


class HostTransport(Transport):
    kind = "host"

    def __init__(self, host: str = "127.0.0.1"):
        self._listener = socket.create_server((host, 0))
        self._address = f"{host}:{self._listener.getsockname()[1]}"
        self._lock = threading.Condition()
        #: tag -> what the step posted for it; tag -> a reader waiting for its buffer
        self._posted: dict[int, _Posted] = {}
        self._closed = False
        #: peer address -> (socket, queue of sends)
        self._out: dict[str, tuple] = {}
        self._readers: list[socket.socket] = []
        #: peers whose connection to us closed, and why (receives from them fail at once)
        self._gone: dict[str, str] = {}
        #: peer address -> connections open from it; and a lock a peer this end connects to
        self._from: dict[str, int] = {}
        self._connecting: dict[str, threading.Lock] = {}
        #: exchange attempts that ended (the latest few): their late payloads are dropped
        self._ended: collections.deque = collections.deque(maxlen=1024)
        threading.Thread(target=self._accept, name="spillway-step-accept", daemon=True).start()

    def address(self) -> str:
        return self._address

    # --- sending

    def send(self, to: str, tag: int, buffer) -> Pending:
        data = buffer.get() if on_device(buffer) else buffer
        flag = Flag()
        _, sends = self._connection(to)
        sends.put((tag, _host_view(data), flag))
        return flag

    def _connection(self, to: str):
        with self._lock:
            found = self._out.get(to)
            if found is not None:
                return found
            if self._closed:
                raise TransportError(f"the host transport of {self._address} is closed")
            # one connection a peer: a second one closed at once would read as this
            # worker gone, at the peer
            connecting = self._connecting.setdefault(to, threading.Lock())
        with connecting:
            with self._lock:
                found = self._out.get(to)
            return found if found is not None else self._connect(to)

    def _connect(self, to: str):
        host, port = to.rsplit(":", 1)
        try:
            sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
        except OSError as e:
            raise TransportError(f"cannot reach the host transport of {to}: {e}") from None
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        me = self._address.encode()
        sock.sendall(_HELLO.pack(len(me)) + me)
        sends: queue.Queue = queue.Queue()
        with self._lock:
            self._out[to] = (sock, sends)
        threading.Thread(target=self._write, args=(to, sock, sends), name="spillway-step-send", daemon=True).start()
        return sock, sends

    def _write(self, to: str, sock: socket.socket, sends: queue.Queue) -> None:
        while True:
            item = sends.get()
            if item is None:
                return
            tag, view, flag = item
            try:
                sock.sendall(_HEADER.pack(tag, view.nbytes))
                sock.sendall(view)
            except OSError as e:
                flag.set(f"sending to {to} failed: {e}")
                self._fail_sends(to, sends, f"sending to {to} failed: {e}")
                return
            flag.set()

    def _fail_sends(self, to: str, sends: queue.Queue, why: str) -> None:
        with self._lock:
            self._out.pop(to, None)
        while True:
            try:
                item = sends.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[2].set(why)

    # --- receiving

    def recv(self, source: str, tag: int, buffer) -> Pending:
        import numpy as np

        host = np.empty(buffer.shape, buffer.dtype) if on_device(buffer) else buffer
        flag = Flag()
        with self._lock:
            gone = self._gone.get(source)
            if gone is not None:
                flag.set(gone)
            else:
                self._posted[tag] = _Posted(source, _host_view(host), flag)
                self._lock.notify_all()
        return Staged(flag, host, buffer) if host is not buffer else flag

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._readers.append(sock)
            threading.Thread(target=self._read, args=(sock,), name="spillway-step-recv", daemon=True).start()

    def _read(self, sock: socket.socket) -> None:
        peer = "an unknown peer"
        try:
            (n,) = _HELLO.unpack(_exactly(sock, _HELLO.size))
            peer = _exactly(sock, n).decode()
            with self._lock:
                self._gone.pop(peer, None)
                self._from[peer] = self._from.get(peer, 0) + 1
            while True:
                tag, nbytes = _HEADER.unpack(_exactly(sock, _HEADER.size))
                posted = self._take_posted(tag)
                if posted is None:
                    if self._closed:
                        return
                    _discard(sock, nbytes)  # an exchange that ended: no buffer will come
                    continue
                if posted.view.nbytes != nbytes:
                    posted.flag.set(f"{peer} sent {nbytes} bytes under tag {tag:#x}, {posted.view.nbytes} expected")
                    _discard(sock, nbytes)
                    continue
                view, got = posted.view, 0
                while got < nbytes:
                    k = sock.recv_into(view[got:], nbytes - got)
                    if k == 0:
                        raise ConnectionResetError("closed mid-buffer")
                    got += k
                posted.flag.set()
        except (OSError, struct.error) as e:
            with self._lock:
                left = self._from.get(peer, 1) - 1
                self._from[peer] = left
            if left <= 0:
                self._lost(peer, f"the connection from {peer} closed ({type(e).__name__})")
        finally:
            sock.close()

    def _take_posted(self, tag: int) -> _Posted | None:
        with self._lock:
            while tag not in self._posted:
                if self._closed or tag >> ATTEMPT_SHIFT in self._ended:
                    return None
                self._lock.wait(0.5)
            return self._posted.pop(tag)

    def _lost(self, peer: str, why: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._gone[peer] = why
            for tag in [t for t, p in self._posted.items() if p.source == peer]:
                self._posted.pop(tag).flag.set(why)
            self._lock.notify_all()

    def forget(self, exchange: int, pending: list) -> None:
        """An exchange attempt ended (``exchange``: its tags' high bits): its posted
        receives are let go, and payloads of it that come later are read and dropped."""
        with self._lock:
            for tag in [t for t in self._posted if t >> ATTEMPT_SHIFT == exchange]:
                self._posted.pop(tag)
            self._ended.append(exchange)
            self._lock.notify_all()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            out, readers = list(self._out.values()), list(self._readers)
            self._out.clear()
            for posted in self._posted.values():
                posted.flag.set("the host transport closed")
            self._posted.clear()
            self._lock.notify_all()
        try:
            self._listener.close()
        except OSError:
            pass
        for sock, sends in out:
            sends.put(None)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for sock in readers:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        data = sock.recv(n - got)
        if not data:
            raise ConnectionResetError("closed")
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def _discard(sock: socket.socket, n: int) -> None:
    while n:
        data = sock.recv(min(n, 1 << 20))
        if not data:
            raise ConnectionResetError("closed")
        n -= len(data)
