from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from client_sdk import AsyncClient, Client, Journal

# the helpers next to this file import the same way under any pytest import mode
sys.path.insert(0, str(Path(__file__).parent))
from fake_idempay import API_KEY, FakeClock, FakeIdempay  # noqa: E402

if TYPE_CHECKING:  # the unit lane never starts a server: these load only in the fixtures
    from idempay_tools.chaos_proxy import ProxyThread
    from tests.support.backend import Backend
    from tests.support.services import Server


# One server per backend for the whole run, not one per module: a server start costs seconds
# on a loaded two-core machine, and these servers run the suite's default settings on the
# session's shared databases anyway. Every test here makes a merchant of its own (nothing a
# server keeps in memory is shared across merchants) and none stops or restarts these; a
# test that needs other settings, or a database of its own, starts its own server.
@pytest.fixture(scope="session")
def server(backend: Backend) -> Iterator[Server]:
    """The real server (a uvicorn process), on each backend in turn, for the run's tests."""
    running = backend.server()
    yield running
    running.stop()


@pytest.fixture(scope="session")
def pg_server(pg_backend: Backend) -> Iterator[Server]:
    """The real server on Postgres only, for the run's tests."""
    running = pg_backend.server()
    yield running
    running.stop()


@pytest.fixture
def proxy(pg_server: Server) -> Iterator[ProxyThread]:
    """The chaos proxy, lossless until told otherwise, in front of ``pg_server``."""
    from idempay_tools.chaos_proxy import ChaosProxy

    thread = ChaosProxy(target_host="127.0.0.1", target_port=pg_server.port, loss=0.0)
    running = thread.run_in_thread()
    yield running
    running.stop()


@pytest.fixture
def fake() -> FakeIdempay:
    return FakeIdempay()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    return tmp_path / "pos.db"


@pytest.fixture
def older_journal(journal_path: Path) -> Callable[[str], Journal]:
    """Opens the journal at ``journal_path`` after an older SDK's ``schema`` (its SQL
    script) wrote the file: what an upgrade of the SDK finds."""

    def open_after(schema: str) -> Journal:
        db = sqlite3.connect(journal_path)
        db.executescript(schema)
        db.close()
        return Journal(journal_path)

    return open_after


@pytest.fixture
def make_client(
    fake: FakeIdempay, clock: FakeClock, journal_path: Path
) -> Iterator[Callable[..., Client]]:
    clients: list[Client] = []

    def make(**overrides: Any) -> Client:
        options: dict[str, Any] = {
            "terminal_id": "T-0001",
            "journal": journal_path,
            "network": "gprs",
            "transport": fake.transport(),
            "seed": 7,
            "clock": clock,
            "monotonic": clock,
            "sleep": clock.sleep,
            "abort_grace_s": 5.0,
        }
        options.update(overrides)
        api_key = options.pop("api_key", API_KEY)
        client = Client("http://idempay.test", api_key, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def make_async_client(
    fake: FakeIdempay, clock: FakeClock, journal_path: Path
) -> Callable[..., AsyncClient]:
    def make(**overrides: Any) -> AsyncClient:
        options: dict[str, Any] = {
            "terminal_id": "T-0001",
            "journal": journal_path,
            "network": "4g",
            "transport": fake.transport(),
            "seed": 7,
            "clock": clock,
            "monotonic": clock,
            "sleep": clock.async_sleep,
            "abort_grace_s": 5.0,
        }
        options.update(overrides)
        return AsyncClient("http://idempay.test", API_KEY, **options)

    return make
