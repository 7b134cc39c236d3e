"""A hostile acquirer for a real server: ``tests/api/acquirer/fake_acquirer.FakeAcquirer``
(an asyncio TCP server speaking the link's frames) on an event loop of its own thread, so
a synchronous test can point a server process at it and read what it received."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from tests.api.acquirer.fake_acquirer import FakeAcquirer, Policy


class ThreadedFake:
    def __init__(self, policy: Policy) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.fake = FakeAcquirer(policy=policy)

    def start(self) -> ThreadedFake:
        self.thread.start()
        self.call(self.fake.start())
        return self

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def stop(self) -> None:
        self.call(self.fake.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def url(self) -> str:
        return self.fake.url

    def received(self, mti: str, rrn: str | None = None) -> int:
        """How many requests of ``mti`` came (for ``rrn`` when given)."""

        async def count() -> int:
            return sum(
                1
                for r in self.fake.received
                if r.mti == mti and (rrn is None or r.fields.get("37") == rrn)
            )

        return int(self.call(count()))

    def sign_ons(self) -> int:
        async def count() -> int:
            return sum(1 for r in self.fake.received if r.network_code == "001")

        return int(self.call(count()))
