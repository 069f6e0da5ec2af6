"""A keep-alive HTTP/1.1 client for the harness's Sealion queries.

Why not Python's ``http.client``: it parses every answer's headers with the
``email`` package, in Python, which costs about 0.1 ms an answer
(``bench/results/http-client-2026-12-06.md``). PostgreSQL's answers reach
the harness through libpq, which parses them in C, so for queries that take
a few tenths of a millisecond ``http.client`` made Sealion's column measure
the client more than the server. libcurl (pycurl) was tried and hands large
answers to Python a piece at a time, a call and a copy each, which cost more
than it saved on 8 MB answers.

This client sends one request on one socket and reads the answer into one
buffer: the head is split at its blank line and only the status, the
``Content-Length``, ``Transfer-Encoding`` and ``Connection`` headers are
read; a body of known length is received straight into a buffer of that
size (``recv_into``), so a large answer costs one copy, as it does with
``http.client``. Chunked bodies are decoded too, so a server that streams
an answer is still read right; anything else it cannot read (no length, a
malformed head) raises ``HttpError`` instead of guessing. It speaks to one
server the harness started on loopback; it is not a general HTTP client
(no redirects, no TLS, no proxies).
"""

from __future__ import annotations

import socket

# Largest head (status line and headers) accepted.
MAX_HEAD_BYTES = 64 * 1024
# Largest body accepted (the server's own answer limit is far below this).
MAX_BODY_BYTES = 4 << 30
_RECV = 256 * 1024


class HttpError(RuntimeError):
    """An answer this client cannot read."""


class Connection:
    """One keep-alive connection to ``host:port``; reconnects when the
    server has closed it between requests."""

    def __init__(self, host: str, port: int, timeout: float = 3600):
        self.host, self.port, self.timeout = host, port, timeout
        self.sock: socket.socket | None = None
        # Bytes received past the end of the last answer (none in practice:
        # one request is in flight at a time).
        self.rest = b""

    def _connect(self) -> socket.socket:
        s = socket.create_connection((self.host, self.port), timeout=self.timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.rest = s, b""
        return s

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes | bytearray]:
        """Sends one request and returns (status, body); a long body comes
        back as the ``bytearray`` it was received into. A connection the
        server closed while idle is opened again once."""
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        for attempt in range(2):
            fresh = self.sock is None
            s = self.sock or self._connect()
            try:
                s.sendall(head + body if len(body) < 65536 else head)
                if len(body) >= 65536:
                    s.sendall(body)
                return self._answer(s)
            except (ConnectionError, _Closed):
                self.close()
                if attempt or fresh:
                    raise
        raise AssertionError("unreachable")

    def _recv(self, s: socket.socket) -> bytes:
        data = s.recv(_RECV)
        if not data:
            raise HttpError("connection closed in the middle of an answer")
        return data

    def _answer(self, s: socket.socket) -> tuple[int, bytes | bytearray]:
        buf = self.rest
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(buf) > MAX_HEAD_BYTES:
                raise HttpError(f"answer head over {MAX_HEAD_BYTES} bytes")
            buf += self._recv(s) if buf else self._first(s)
        lines = buf[:end].split(b"\r\n")
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
            raise HttpError(f"not an HTTP/1 status line: {lines[0][:200]!r}")
        status = int(status_line[1])
        length, chunked, close = None, False, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value.strip())
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = value.strip().lower() == b"close"
        rest = buf[end + 4:]
        if chunked:
            body, self.rest = self._chunked(s, rest)
        elif length is not None:
            if length > MAX_BODY_BYTES:
                raise HttpError(f"answer of {length} bytes is over {MAX_BODY_BYTES}")
            body, self.rest = self._exactly(s, rest, length)
        elif status in (204, 304) or 100 <= status < 200:
            body, self.rest = b"", rest
        else:
            raise HttpError(f"HTTP {status} answer with neither Content-Length nor chunked body")
        if close:
            self.close()
        return status, body

    def _first(self, s: socket.socket) -> bytes:
        """The first bytes of an answer; a keep-alive connection the server
        closed while idle shows here as an empty read (then the request is
        sent again on a new connection)."""
        data = s.recv(_RECV)
        if not data:
            raise _Closed()
        return data

    def _exactly(self, s: socket.socket, have: bytes, n: int) -> tuple[bytes | bytearray, bytes]:
        """The next ``n`` bytes (``have`` first, then the socket's) and what
        came after them. A long body is received into the buffer it is
        returned in: copying it into ``bytes`` would touch every page of a
        second buffer as large (about 8 ms for 8 MB here)."""
        if len(have) >= n:
            return have[:n], have[n:]
        out = bytearray(n)
        out[:len(have)] = have
        view, pos = memoryview(out), len(have)
        while pos < n:
            got = s.recv_into(view[pos:], n - pos)
            if got == 0:
                raise HttpError(f"connection closed after {pos} of {n} body bytes")
            pos += got
        view.release()
        return out, b""

    def _chunked(self, s: socket.socket, buf: bytes) -> tuple[bytes, bytes]:
        parts = []
        while True:
            while b"\r\n" not in buf:
                buf += self._recv(s)
            line, _, buf = buf.partition(b"\r\n")
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                # Trailers (none expected) end with a blank line.
                while True:
                    while b"\r\n" not in buf:
                        buf += self._recv(s)
                    line, _, buf = buf.partition(b"\r\n")
                    if not line:
                        return b"".join(parts), buf
            chunk, buf = self._exactly(s, buf, size + 2)
            if chunk[size:] != b"\r\n":
                raise HttpError("chunk not followed by CRLF")
            parts.append(bytes(chunk[:size]))


class _Closed(ConnectionError):
    """The server closed the connection before an answer began."""
