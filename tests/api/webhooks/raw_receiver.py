"""A webhook receiver on 127.0.0.1 that misbehaves at the socket level, as told: it trickles
its status line's headers, or a 200's body, a byte at a time; answers with a huge body as
fast as the sender takes it; or holds every request until the test releases it. It records
what it was sent and what it managed to send back."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from typing import Any, Literal

Mode = Literal["ok", "trickle_headers", "trickle_body", "huge", "gate"]
CHUNK = 64 * 1024


class RawReceiver:
    def __init__(self, mode: Mode, *, status: int = 200, size: int = 0, pace: float = 0.2) -> None:
        self.mode = mode
        self.status = status
        self.size = size  # "huge": the body's length, announced in Content-Length
        self.pace = pace  # seconds between trickled bytes
        self.gate = threading.Event()  # "gate": set it to let the held requests be answered
        self.event_ids: list[str] = []  # one per request, in arrival order
        self.hosts: list[str] = []  # the Host header of each request
        self.connections = 0
        self.open = 0  # connections being answered now
        self.answered = 0  # requests answered in full
        self.sent = 0  # "huge": body bytes the sender took before it closed
        self.cut = 0  # answers the sender cut short by closing the connection
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        receiver = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                receiver._handle(self.request)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def __enter__(self) -> RawReceiver:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopping.set()
        self.gate.set()
        self._server.shutdown()
        self._server.server_close()

    def _read_request(self, conn: socket.socket) -> dict[str, str] | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            body += chunk
        return headers

    def _handle(self, conn: socket.socket) -> None:
        with self._lock:
            self.connections += 1
        while not self._stopping.is_set():
            headers = self._read_request(conn)
            if headers is None:
                return
            with self._lock:
                self.event_ids.append(headers.get("idempay-event-id", ""))
                self.hosts.append(headers.get("host", ""))
                self.open += 1
            try:
                self._answer(conn)
            except OSError:  # the sender closed the connection
                with self._lock:
                    self.cut += 1
                return
            finally:
                with self._lock:
                    self.open -= 1
            with self._lock:
                self.answered += 1

    def _answer(self, conn: socket.socket) -> None:
        reason = {200: "OK", 500: "Internal Server Error"}.get(self.status, "Status")
        status_line = f"HTTP/1.1 {self.status} {reason}\r\n".encode()
        if self.mode == "gate":
            while not self.gate.wait(0.05):
                if self._stopping.is_set():
                    return
        if self.mode in ("ok", "gate"):
            conn.sendall(status_line + b"Content-Length: 0\r\n\r\n")
        elif self.mode == "trickle_headers":
            conn.sendall(status_line + b"X-Slow: ")
            self._trickle(conn)
        elif self.mode == "trickle_body":
            conn.sendall(status_line + b"Content-Length: 1000000000\r\n\r\n")
            self._trickle(conn)
        else:  # huge
            conn.sendall(status_line + f"Content-Length: {self.size}\r\n\r\n".encode())
            block = b"x" * CHUNK
            while self.sent < self.size:
                conn.sendall(block[: self.size - self.sent])
                with self._lock:
                    self.sent += min(CHUNK, self.size - self.sent)

    def _trickle(self, conn: socket.socket) -> None:
        while not self._stopping.is_set():
            time.sleep(self.pace)
            conn.sendall(b"a")
        raise OSError("stopping")

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "connections": self.connections,
                "open": self.open,
                "answered": self.answered,
                "cut": self.cut,
                "requests": len(self.event_ids),
            }
