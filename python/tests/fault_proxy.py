"""A TCP proxy in front of a real server that cuts connections: the Python tests' fault
injector (the Rust suites have their own HTTP-aware one in tests/support/proxy.rs).

While ``cut_every`` is above 0, the connection carrying the byte that takes the traffic
through the proxy (both directions together) past the next multiple of ``cut_every``
bytes is reset there, part-way through a request or an answer, as a dying load balancer
leaves it. Cuts follow the traffic, not the number of connections, so a client that
reuses one pooled connection meets them as often as one that opens many. ``cuts`` counts
them. Nothing is parsed: bytes pass as they are.

While ``refuse_puts`` is set, a request that starts with ``PUT `` is answered by the proxy
itself with S3's 403 AccessDenied and its connection closed, without reaching the server:
a server that refuses every write and serves every read. (A client sends a request's first
bytes in a read of their own: it waits for the previous answer first.) ``refused`` counts
them.
"""

from __future__ import annotations

import socket
import threading


class FaultProxy:
    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.cuts = 0
        self.connections = 0
        self.refuse_puts = False
        self.refused = 0
        self._cut_every = 0
        self._next_cut = 0
        self._traffic = 0
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def cut_every(self) -> int:
        return self._cut_every

    @cut_every.setter
    def cut_every(self, nbytes: int) -> None:
        with self._lock:
            self._cut_every = nbytes
            self._next_cut = self._traffic + nbytes

    def close(self) -> None:
        self._closed = True
        self._sock.close()

    def _cut_here(self, nbytes: int) -> int | None:
        """Counts ``nbytes`` of traffic; returns how many of them pass before a cut, or
        None when the connection carries on."""
        with self._lock:
            start = self._traffic
            self._traffic += nbytes
            if self._cut_every and self._traffic >= self._next_cut:
                keep = max(0, self._next_cut - start)
                self._next_cut = self._traffic + self._cut_every
                self.cuts += 1
                return keep
        return None

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.connections += 1
            pair = _Pair(client, server, self)
            threading.Thread(target=pair.pump, args=(client, server), daemon=True).start()
            threading.Thread(target=pair.pump, args=(server, client), daemon=True).start()


_DENIED_BODY = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
                b"<Message>Access Denied</Message></Error>")
_ACCESS_DENIED = (b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\nConnection: close\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(_DENIED_BODY) + _DENIED_BODY)


class _Pair:
    """Both directions of one proxied connection; either side ending (or a cut) ends both."""

    def __init__(self, client: socket.socket, server: socket.socket, proxy: FaultProxy):
        self.client, self.server, self.proxy = client, server, proxy
        self._done = threading.Lock()
        self._closed = False

    def pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if src is self.client and self.proxy.refuse_puts and data.startswith(b"PUT "):
                    with self.proxy._lock:
                        self.proxy.refused += 1
                    src.sendall(_ACCESS_DENIED)
                    break
                keep = self.proxy._cut_here(len(data))
                if keep is not None:
                    dst.sendall(data[:keep])
                    # A reset, not a clean close: the peers see the connection fail.
                    for s in (self.client, self.server):
                        try:
                            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                        except OSError:
                            pass
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._close()

    def _close(self) -> None:
        with self._done:
            if self._closed:
                return
            self._closed = True
        for s in (self.client, self.server):
            # shutdown first: it wakes the other direction's thread blocked on the socket
            # (close alone would leave that half of the connection hanging).
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass
