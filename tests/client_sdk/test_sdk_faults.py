"""Fault-injecting transports (client_sdk/faults.py), and the SDK's guarantees under them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_idempay import API_KEY, CARD, FakeClock, FakeIdempay
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client_sdk import (
    AsyncClient,
    Client,
    JournalState,
    PaymentAbortedError,
    PaymentInDoubtError,
)
from client_sdk.faults import AsyncFaultyTransport, FaultTransport, FaultyTransport


def echo_server() -> tuple[list[str], httpx.MockTransport]:
    received: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        received.append(request.url.path)
        return httpx.Response(200, json={"path": request.url.path})

    return received, httpx.MockTransport(handler)


def outcome(client: httpx.Client, path: str) -> str:
    try:
        client.get(path)
    except httpx.TransportError as exc:
        return type(exc).__name__
    return "ok"


@pytest.mark.parametrize(
    ("option", "errors", "forwarded"),
    [
        ("drop_request", {"ConnectError"}, False),
        ("drop_response", {"ReadTimeout", "RemoteProtocolError"}, True),
    ],
)
def test_drops_before_or_after_the_server(option: str, errors: set[str], forwarded: bool) -> None:
    received, inner = echo_server()
    probabilities: dict[str, Any] = {option: 1.0}
    faulty = FaultTransport(inner, seed=1, **probabilities)
    with httpx.Client(transport=faulty, base_url="http://t") as client:
        seen = {outcome(client, f"/{i}") for i in range(40)}
    assert seen == errors
    assert len(received) == (40 if forwarded else 0)
    assert faulty.stats[option] == faulty.stats["requests"] == 40


def test_resets_happen_both_before_and_after_forwarding() -> None:
    received, inner = echo_server()
    faulty = FaultTransport(inner, seed=2, reset=1.0)
    with httpx.Client(transport=faulty, base_url="http://t") as client:
        assert {outcome(client, "/r") for _ in range(60)} == {"ReadError"}
    stats = faulty.stats
    assert stats["reset_before"] > 0 and stats["reset_after"] > 0
    assert len(received) == stats["reset_after"]


def test_delays_sleep_then_pass() -> None:
    slept: list[float] = []
    received, inner = echo_server()
    faulty = FaultTransport(inner, seed=3, delay=1.0, delay_s=0.25, sleep=slept.append)
    with httpx.Client(transport=faulty, base_url="http://t") as client:
        assert client.get("/d").json() == {"path": "/d"}
    assert slept == [0.25] and received == ["/d"]


def test_a_seed_replays_the_same_faults_and_the_mix_matches_the_probabilities() -> None:
    def run(seed: int) -> tuple[list[str], dict[str, int]]:
        _, inner = echo_server()
        faulty = FaultTransport(
            inner,
            seed=seed,
            drop_request=0.1,
            drop_response=0.1,
            delay=0.1,
            reset=0.1,
            sleep=lambda s: None,
        )
        with httpx.Client(transport=faulty, base_url="http://t") as client:
            return [outcome(client, "/x") for _ in range(2000)], faulty.stats

    first, stats = run(11)
    assert run(11)[0] == first
    assert run(12)[0] != first
    for mode in ("drop_request", "drop_response", "delay"):
        assert 120 < stats[mode] < 280, stats
    assert 120 < stats["reset_before"] + stats["reset_after"] < 280
    assert sum(v for k, v in stats.items() if k != "requests") == stats["requests"] == 2000


@pytest.mark.parametrize(
    "bad", [{"drop_request": 1.5}, {"delay": -0.1}, {"drop_request": 0.6, "drop_response": 0.6}]
)
def test_probabilities_are_validated(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        FaultTransport(httpx.MockTransport(lambda r: httpx.Response(200)), **bad)


async def test_the_async_transport_injects_the_same_way() -> None:
    received: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        received.append(request.url.path)
        return httpx.Response(200)

    faulty = FaultTransport(httpx.MockTransport(handler), seed=5, drop_response=1.0)
    async with httpx.AsyncClient(transport=faulty, base_url="http://t") as client:
        with pytest.raises((httpx.ReadTimeout, httpx.RemoteProtocolError)):
            await client.get("/a")
    assert received == ["/a"] and faulty.stats["drop_response"] == 1


def test_one_class_serves_both_modes_and_the_old_names_are_aliases() -> None:
    assert FaultyTransport is FaultTransport and AsyncFaultyTransport is FaultTransport
    assert issubclass(FaultTransport, httpx.BaseTransport)
    assert issubclass(FaultTransport, httpx.AsyncBaseTransport)


async def test_the_async_mode_awaits_an_async_sleep_and_accepts_a_plain_one() -> None:
    slept: list[float] = []

    async def async_sleep(seconds: float) -> None:
        slept.append(seconds)

    for sleep in (async_sleep, slept.append):
        inner = httpx.MockTransport(lambda r: httpx.Response(200))
        faulty = FaultTransport(inner, seed=1, delay=1.0, delay_s=0.5, sleep=sleep)
        async with httpx.AsyncClient(transport=faulty, base_url="http://t") as client:
            assert (await client.get("/a")).status_code == 200
    assert slept == [0.5, 0.5]


class SyncOnly(httpx.BaseTransport):
    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200)


class AsyncOnly(httpx.AsyncBaseTransport):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200)


async def _no_wait(seconds: float) -> None:
    pass


def test_a_sync_client_over_an_async_transport_or_sleep_is_told_so() -> None:
    faulty = FaultTransport(AsyncOnly())
    with httpx.Client(transport=faulty) as client, pytest.raises(TypeError, match="async"):
        client.get("http://t/a")
    delayed = FaultTransport(SyncOnly(), delay=1.0, sleep=_no_wait)
    with httpx.Client(transport=delayed) as client, pytest.raises(TypeError, match="blocks"):
        client.get("http://t/a")


async def test_an_async_client_over_a_sync_transport_is_told_so() -> None:
    faulty = FaultTransport(SyncOnly())
    async with httpx.AsyncClient(transport=faulty) as client:
        with pytest.raises(TypeError, match="sync transport"):
            await client.get("http://t/a")


def check_invariants(fake: FakeIdempay, client: Client, outcomes: dict[str, str]) -> None:
    """contract §8 for the fake: exactly once, aborted keys have no transaction, the journal
    ends definitive (or honestly in doubt, then recover() settles it)."""
    assert all(n == 1 for n in fake.processed.values())
    for key, seen in outcomes.items():
        record = fake.keys.get(key)
        if seen in ("approved", "declined", "reversed"):
            assert record is not None and record.transaction is not None
            assert record.transaction["status"] == seen and fake.processed[key] == 1
        elif seen == "aborted":
            assert fake.processed[key] == 0
    fake.faults.clear()
    for recovered in client.recover():
        assert recovered.state in (JournalState.RESOLVED, JournalState.ABORTED)
    assert client.journal.unresolved() == []
    for entry in client.journal.entries():
        processed = fake.processed[entry.key] == 1
        assert processed == (entry.state is JournalState.RESOLVED), entry


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), loss=st.sampled_from([0.035, 0.2, 0.5]))
def test_under_random_faults_every_payment_is_processed_at_most_once(
    tmp_path_factory: pytest.TempPathFactory, seed: int, loss: float
) -> None:
    fake, clock = FakeIdempay(), FakeClock()
    faulty = FaultTransport(
        fake.transport(),
        seed=seed,
        drop_request=loss / 4,
        drop_response=loss / 4,
        reset=loss / 4,
        delay=loss / 4,
        delay_s=0.3,
        sleep=clock.sleep,
    )
    journal = tmp_path_factory.mktemp("fleet") / "pos.db"
    outcomes: dict[str, str] = {}
    with Client(
        "http://idempay.test",
        API_KEY,
        terminal_id="T-9",
        journal=journal,
        transport=faulty,
        seed=seed,
        clock=clock,
        sleep=clock.sleep,
        abort_grace_s=3.0,
    ) as client:
        for i in range(20):
            try:
                result = client.purchase(
                    amount=100 + i,
                    currency="BRL",
                    card=CARD,
                    deadline_s=6,
                    reverse_late_approval=i % 2 == 0,
                )
                outcomes[result.id] = result.status
            except PaymentAbortedError as exc:
                outcomes[exc.key] = "aborted"
            except PaymentInDoubtError as exc:
                outcomes[exc.key] = "in_doubt"
        assert len(outcomes) == 20
        check_invariants(fake, client, outcomes)
    assert Counter(outcomes.values())["approved"] > 0


async def test_async_client_under_random_faults(tmp_path: Path) -> None:
    fake, clock = FakeIdempay(), FakeClock()
    faulty = FaultTransport(
        fake.transport(), seed=99, drop_request=0.1, drop_response=0.1, reset=0.1
    )
    async with AsyncClient(
        "http://idempay.test",
        API_KEY,
        terminal_id="T-9",
        journal=tmp_path / "pos.db",
        transport=faulty,
        seed=1,
        clock=clock,
        sleep=clock.async_sleep,
    ) as client:
        statuses: list[str] = []
        for _ in range(30):
            try:
                statuses.append((await client.purchase(amount=5, currency="BRL", card=CARD)).status)
            except (PaymentAbortedError, PaymentInDoubtError):
                statuses.append("unfinished")
    assert all(n == 1 for n in fake.processed.values())
    assert statuses.count("approved") == len(fake.processed)
    assert sum(faulty.stats[k] for k in ("drop_request", "drop_response")) > 0
