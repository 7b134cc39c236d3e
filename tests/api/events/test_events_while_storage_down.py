"""Creates answered 503 while the database is unreachable, and their request events (issue
22, ``make chaos``'s "answered probe creates never logged").

A real ``idempay serve`` on a private Postgres database, reached through a TCP hop the test
can shut (every connection cut, new ones refused: the chaos run's Postgres crash as the
worker sees it).

- A worker that knows the caller's merchant (its API key is in the worker's cache) answers
  a create 503 and queues the create's event; the event is written once the database is
  back. Lost, it would be an event the writer dropped.
- A worker that must look the API key up (its cache holds no live entry for it: a new
  worker, or an entry past its minute, ``api.auth.CACHE_SECONDS``) answers 503 *before it
  knows the merchant*, and a request event has no row without one (``merchant_id`` is
  part of ``request_event``'s key). That create is never logged. This is what failed the
  chaos run at 6543518 (seed 7): the probe's one keep-alive connection stays on one
  worker, whose cache entry for the probe's key is refreshed once a minute; when the
  refresh falls inside the Postgres crash, the probe's creates from then until the
  database answers again are answered 503 and have no event. The chaos check exempts
  503s answered while storage was down (``idempay_tools._chaos_lake``) because of this.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import httpx

from idempay_tools.serve_process import LOCAL
from tests.support.backend import Backend
from tests.support.client import body
from tests.support.services import Server

PG_PORT = 5432


class TcpHop:
    """A TCP forwarder to the shared Postgres, in threads of the test process (the server is
    another process). ``shut()`` cuts every connection and refuses new ones; ``open()``
    lets them through again."""

    def __init__(self) -> None:
        self._listener = socket.create_server((LOCAL, 0))
        self.port = int(self._listener.getsockname()[1])
        self._shut = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="tcp-hop", daemon=True)

    @contextmanager
    def running(self) -> Iterator[TcpHop]:
        self._thread.start()
        try:
            yield self
        finally:
            self._closed = True
            self.shut()
            self._listener.close()
            self._thread.join(5)

    def shut(self) -> None:
        self._shut.set()
        with self._lock:
            for sock in list(self._open):
                _abort(sock)
            self._open.clear()

    def open(self) -> None:
        self._shut.clear()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._shut.is_set():
                _abort(client)
                continue
            try:
                server = socket.create_connection((LOCAL, PG_PORT), timeout=5)
            except OSError:
                _abort(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._open.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(source)
                self._open.discard(sink)
            _abort(source)
            _abort(sink)


def _abort(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), as a crashed server's connections end."""
    with suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)  # wakes the other direction's thread in recv()
    with suppress(OSError):
        sock.close()


def _create(client: httpx.Client, api_key: str, key: str) -> int:
    answer = client.post(
        "/v1/transactions",
        json=body(terminal_id="PROBE-1", amount=100),
        headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": key},
    )
    return answer.status_code


def _events(backend: Backend, key: str) -> list[tuple[str, int]]:
    """The create events of ``key`` (a fresh UUID: under any merchant)."""
    rows = backend.sql(
        "SELECT outcome, http_status FROM request_event WHERE idempotency_key = :k "
        "AND endpoint = 'create'",
        k=key,
    )
    return [(str(outcome), int(status)) for outcome, status in rows]


@contextmanager
def _server_through(hop: TcpHop, backend: Backend) -> Iterator[Server]:
    assert backend.database_url is not None and f":{PG_PORT}/" in backend.database_url
    url = backend.database_url.replace(f":{PG_PORT}/", f":{hop.port}/")
    server = backend.server(
        IDEMPAY_DATABASE_URL=url,
        IDEMPAY_DB_TIMEOUT="1",  # a refused connection answers 503 at once anyway
    )
    try:
        yield server
    finally:
        server.stop()  # SIGTERM: the writer drains its queue (the database is back)


@contextmanager
def _client_through_a_hop(backend: Backend) -> Iterator[tuple[TcpHop, httpx.Client]]:
    """A server whose database connections go through a TCP hop (to shut), and a client."""
    with (
        TcpHop().running() as hop,
        _server_through(hop, backend) as server,
        httpx.Client(base_url=server.url, timeout=30.0) as client,
    ):
        yield hop, client


def test_a_create_answered_503_by_a_worker_that_knows_the_merchant_is_logged(
    private_pg_backend: Backend,
) -> None:
    api_key = private_pg_backend.api_key("chaos-probe")
    warm, down = str(uuid.uuid4()), str(uuid.uuid4())
    with _client_through_a_hop(private_pg_backend) as (hop, client):
        assert _create(client, api_key, warm) == 201  # the worker caches the API key
        hop.shut()
        assert _create(client, api_key, down) == 503
        hop.open()
    assert _events(private_pg_backend, warm) == [("created", 201)]
    assert _events(private_pg_backend, down) == [("error", 503)]


def test_a_create_answered_503_before_the_merchant_was_known_has_no_event(
    private_pg_backend: Backend,
) -> None:
    """The loss the chaos check exempts: the worker never saw this API key (as after its
    cache entry's minute), the key lookup meets the outage, 503, no merchant, no event."""
    api_key = private_pg_backend.api_key("chaos-probe")
    down, after = str(uuid.uuid4()), str(uuid.uuid4())
    with _client_through_a_hop(private_pg_backend) as (hop, client):
        hop.shut()
        assert _create(client, api_key, down) == 503  # answered: the probe counts it
        hop.open()
        assert _create(client, api_key, after) == 201
    assert _events(private_pg_backend, after) == [("created", 201)]
    assert _events(private_pg_backend, down) == []
    answered = private_pg_backend.sql("SELECT count(*) FROM request_event WHERE http_status = 503")
    assert int(answered[0][0]) == 0  # under no merchant at all
