"""Checks of httpconn.Connection against a real HTTP server (Python's own,
on loopback): bodies of every size by length and chunked, keep-alive reuse,
a server that closes between requests, and answers it must refuse.

    python3 -m unittest bench/compare/test_httpconn.py
"""

from __future__ import annotations

import http.server
import os
import random
import sys
import threading
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from httpconn import Connection, HttpError  # noqa: E402


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(n)
        kind, _, arg = self.path.lstrip("/").partition("/")
        if kind == "echo":
            self._reply(200, body)
        elif kind == "bytes":
            self._reply(200, random.Random(int(arg)).randbytes(int(arg)))
        elif kind == "chunked":
            data = random.Random(int(arg)).randbytes(int(arg))
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(data), 7_777):
                piece = data[i:i + 7_777]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif kind == "close":
            self._reply(200, b"bye", close=True)
        elif kind == "nolength":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"no length")
            self.close_connection = True
        elif kind == "status":
            self._reply(int(arg), b'{"error":"x"}')
        elif kind == "nocontent":
            self.send_response(204)
            self.end_headers()

    def _reply(self, status: int, body: bytes, close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        if close:
            self.close_connection = True


class ConnectionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        cls.port = cls.server.server_address[1]
        threading.Thread(target=cls.server.serve_forever, daemon=True).start()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.shutdown()

    def conn(self) -> Connection:
        c = Connection("127.0.0.1", self.port, timeout=30)
        self.addCleanup(c.close)
        return c

    def test_bodies_by_length_come_back_whole_on_one_connection(self) -> None:
        c = self.conn()
        for n in [0, 1, 100, 65_535, 65_536, 300_001, 5_000_000]:
            status, body = c.request("POST", f"/bytes/{n}")
            self.assertEqual(status, 200)
            self.assertEqual(body, random.Random(n).randbytes(n))
        first = c.sock
        c.request("POST", "/bytes/10")
        self.assertIs(c.sock, first, "the connection was not kept alive")

    def test_request_bodies_of_every_size_arrive(self) -> None:
        c = self.conn()
        for n in [0, 10, 65_535, 65_536, 1_000_000]:
            data = os.urandom(n)
            self.assertEqual(c.request("POST", "/echo", data), (200, data))

    def test_chunked_bodies_are_decoded(self) -> None:
        c = self.conn()
        for n in [0, 5, 7_777, 100_000]:
            self.assertEqual(c.request("POST", f"/chunked/{n}"), (200, random.Random(n).randbytes(n)))
        self.assertEqual(c.request("POST", "/bytes/3"), (200, random.Random(3).randbytes(3)))

    def test_a_connection_the_server_closed_is_opened_again(self) -> None:
        c = self.conn()
        self.assertEqual(c.request("POST", "/close"), (200, b"bye"))
        self.assertIsNone(c.sock)
        self.assertEqual(c.request("POST", "/echo", b"again"), (200, b"again"))

    def test_error_statuses_come_back_with_their_bodies(self) -> None:
        c = self.conn()
        self.assertEqual(c.request("POST", "/status/404"), (404, b'{"error":"x"}'))
        self.assertEqual(c.request("POST", "/nocontent"), (204, b""))
        self.assertEqual(c.request("POST", "/echo", b"ok"), (200, b"ok"))

    def test_an_answer_without_a_length_is_refused(self) -> None:
        c = self.conn()
        with self.assertRaises(HttpError):
            c.request("POST", "/nolength")


if __name__ == "__main__":
    unittest.main()
