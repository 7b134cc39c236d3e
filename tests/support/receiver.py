"""A webhook receiver on 127.0.0.1 for tests: answers as told (200, 500, or too late),
checks every signature by hand (HMAC-SHA256 over ``t.body``, not with the server's code)
and dedupes by event id, as a merchant's back office would."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    def __init__(self, secret: str = "", *, fail_first: int = 0, delay: float = 0.0) -> None:
        self.secret = secret
        self.fail_first = fail_first  # answer 500 to this many requests first
        self.delay = delay  # seconds before answering (longer than the sender's timeout)
        self.attempts: list[str] = []  # event ids, one per request
        self.events: list[dict[str, Any]] = []  # deduped by event id, in arrival order
        self.bad_signatures = 0
        self.in_flight = 0
        self.max_in_flight = 0  # requests being answered at once
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hooks"

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _signed(self, header: str, body: bytes) -> bool:
        fields = dict(part.split("=", 1) for part in header.split(","))
        signed = fields["t"].encode() + b"." + body
        expected = hmac.new(self.secret.encode(), signed, hashlib.sha256).hexdigest()
        fresh = abs(time.time() - int(fields["t"])) < 300
        return fresh and hmac.compare_digest(expected, fields["v1"])

    def _receive(self, headers: Any, body: bytes) -> int:
        with self._lock:
            event_id = headers["Idempay-Event-Id"]
            self.attempts.append(event_id)
            if self.fail_first > 0:
                self.fail_first -= 1
                return 500
            if not self._signed(headers["Idempay-Signature"], body):
                self.bad_signatures += 1
                return 400
            event = json.loads(body)
            assert event["event_id"] == event_id
            if all(seen["event_id"] != event_id for seen in self.events):
                self.events.append(event)
            return 200

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver._lock:
                    receiver.in_flight += 1
                    receiver.max_in_flight = max(receiver.max_in_flight, receiver.in_flight)
                if receiver.delay:
                    time.sleep(receiver.delay)
                status = receiver._receive(self.headers, body)
                with receiver._lock:
                    receiver.in_flight -= 1
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        return Handler
