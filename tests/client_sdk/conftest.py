from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_idempay import API_KEY, FakeIdempay

from client_sdk import AsyncClient, Client

CARD = {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}


class FakeClock:
    """Wall clock under test control: sleeping advances it instantly."""

    def __init__(self, start: float = 1_795_000_000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


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
def make_client(
    fake: FakeIdempay, clock: FakeClock, journal_path: Path
) -> Iterator[Callable[..., Client]]:
    clients: list[Client] = []

    def make(**overrides: Any) -> Client:
        options: dict[str, Any] = {
            "terminal_id": "T-0001", "journal": journal_path, "network": "gprs",
            "transport": fake.transport(), "seed": 7, "clock": clock, "sleep": clock.sleep,
            "abort_grace_s": 5.0,
        }
        options.update(overrides)
        client = Client("http://idempay.test", API_KEY, **options)
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
            "terminal_id": "T-0001", "journal": journal_path, "network": "4g",
            "transport": fake.transport(), "seed": 7, "clock": clock,
            "sleep": clock.async_sleep, "abort_grace_s": 5.0,
        }
        options.update(overrides)
        return AsyncClient("http://idempay.test", API_KEY, **options)

    return make
