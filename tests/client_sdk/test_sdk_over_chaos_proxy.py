"""The SDK over real loopback sockets through the chaos proxy (no fakes in the network)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fake_idempay import API_KEY, CARD, FakeIdempay

from client_sdk import (
    AsyncClient,
    Client,
    JournalState,
    PaymentAbortedError,
    PaymentInDoubtError,
    RetryPolicy,
)
from idempay_tools.chaos_proxy import ChaosProxy


class HttpFake:
    """Serves a FakeIdempay over HTTP/1.1 on 127.0.0.1, on its own loop in a thread."""

    def __init__(self, fake: FakeIdempay) -> None:
        self.fake = fake
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0)
        )
        self.port: int = self.server.sockets[0].getsockname()[1]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        async def close() -> None:
            self.server.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                lines = head.split("\r\n")
                method, target, _ = lines[0].split(" ")
                headers = [
                    (name.strip(), value.strip())
                    for name, value in (line.split(":", 1) for line in lines[1:] if line)
                ]
                length = int(dict((k.lower(), v) for k, v in headers).get("content-length", 0))
                body = await reader.readexactly(length)
                request = httpx.Request(
                    method, f"http://idempay.test{target}", headers=headers, content=body
                )
                response = self.fake.handle(request)
                payload = response.content
                writer.write(
                    f"HTTP/1.1 {response.status_code} X\r\n".encode()
                    + b"".join(
                        f"{k}: {v}\r\n".encode()
                        for k, v in response.headers.items()
                        if k != "content-length"
                    )
                    + f"content-length: {len(payload)}\r\n\r\n".encode()
                    + payload
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
def served() -> Iterator[tuple[FakeIdempay, int]]:
    fake = FakeIdempay()
    server = HttpFake(fake)
    yield fake, server.port
    server.stop()


def test_payments_over_a_lossy_link_are_processed_exactly_once(
    served: tuple[FakeIdempay, int], tmp_path: Path
) -> None:
    fake, port = served
    proxy = ChaosProxy(
        target_host="127.0.0.1", target_port=port, seed=5, loss=0.3, reset_ratio=0.3
    ).run_in_thread()
    outcomes: dict[str, str] = {}
    try:
        with Client(
            f"http://127.0.0.1:{proxy.port}",
            API_KEY,
            terminal_id="T-7",
            journal=tmp_path / "pos.db",
            timeout=2.0,
            retry=RetryPolicy(base=0.01, cap=0.05),
            abort_grace_s=2.0,
            seed=5,
        ) as client:
            for i in range(30):
                try:
                    result = client.purchase(
                        amount=100 + i, currency="BRL", card=CARD, deadline_s=5
                    )
                    outcomes[result.id] = result.status
                except (PaymentAbortedError, PaymentInDoubtError) as exc:
                    outcomes[exc.key] = type(exc).__name__
            recovered = client.recover()
            entries = client.journal.entries()
        stats = proxy.stats
    finally:
        proxy.stop()
    assert stats["drop_request"] > 0 and stats["drop_response"] > 0
    assert stats["reset_before"] + stats["reset_after"] > 0
    assert len(outcomes) == 30
    assert all(n == 1 for n in fake.processed.values())
    for key, status in outcomes.items():
        if status == "approved":
            assert fake.processed[key] == 1
    assert all(r.state is not JournalState.IN_DOUBT for r in recovered)
    for entry in entries:
        assert entry.state.is_terminal
        assert (entry.state is JournalState.RESOLVED) == (fake.processed[entry.key] == 1)
    lookups = [s for s in fake.seen if s.endpoint == "lookup"]
    attempts = {s.headers["idempotency-attempt"] for s in fake.seen if s.endpoint == "create"}
    assert lookups and attempts > {"1"}  # in-doubt lookups and resends did happen


def test_an_async_client_reused_on_a_second_event_loop_never_raises_raw(
    served: tuple[FakeIdempay, int], tmp_path: Path
) -> None:
    """Issue 24 item 3: the pooled connection belongs to the first (closed) loop; the
    create left and was approved, then ``RuntimeError: Event loop is closed`` reached the
    app. It is in doubt like a lost answer, and the lookup resolves it."""
    fake, port = served
    pos = AsyncClient(
        f"http://127.0.0.1:{port}",
        API_KEY,
        terminal_id="T-LOOPS",
        journal=tmp_path / "pos.db",
        timeout=2.0,
        abort_grace_s=1.0,
    )

    async def buy(amount: int) -> str:
        result = await pos.purchase(amount=amount, currency="BRL", card=CARD, deadline_s=5)
        return result.status

    assert asyncio.run(buy(100)) == "approved"
    assert asyncio.run(buy(200)) == "approved"  # on a new loop
    asyncio.run(pos.close())
    assert sorted(fake.processed.values()) == [1, 1]
