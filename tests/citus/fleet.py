"""A small paying fleet for the Citus fault tests: one thread per merchant, each creating
payments with fresh keys back to back and recording every answer with the phase of the
run it was sent in (the test moves the phase as it injects the fault)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from api.config import Settings
from api.db import create_engine
from idempay_tools.invariants import InvariantReport, check_invariants
from tests.support.client import Api, body, new_key

BACKOFF = 0.05  # seconds a terminal waits after an answer other than 201


@dataclass(frozen=True)
class Answer:
    merchant_id: str
    key: str
    status: int
    phase: str  # the phase when the request was sent
    sent_at: float
    answered_at: float


@dataclass
class Fleet:
    """``merchants``: merchant id → its API (one terminal each)."""

    merchants: dict[str, Api]
    phase: str = "before"
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Fleet:
        for number, (merchant_id, api) in enumerate(self.merchants.items()):
            thread = threading.Thread(
                target=self._pay, args=(merchant_id, api, f"T-{number:04d}"), daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def _pay(self, merchant_id: str, api: Api, terminal: str) -> None:
        with httpx.Client(base_url=api.base_url, timeout=30.0) as client:
            while not self._stop.is_set():
                key, phase, sent = new_key(), self.phase, time.monotonic()
                try:
                    status = client.post(
                        "/v1/transactions",
                        json=body(terminal_id=terminal, amount=700),
                        headers=api.headers(key),
                    ).status_code
                except httpx.HTTPError:
                    status = 0  # no answer: in doubt, like a cut link
                with self._lock:
                    self.answers.append(
                        Answer(merchant_id, key, status, phase, sent, time.monotonic())
                    )
                if status != 201:
                    time.sleep(BACKOFF)  # a terminal waits before its next sale

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def statuses(self, merchant_ids: set[str], phase: str | None = None) -> Counter[int]:
        return Counter(
            a.status
            for a in self.answers
            if a.merchant_id in merchant_ids and (phase is None or a.phase == phase)
        )

    def retry_unanswered(self) -> dict[str, int]:
        """Every key not answered 201, again with the same key and body: key → status."""
        unanswered = [a for a in self.answers if a.status != 201]
        terminals = {m: f"T-{n:04d}" for n, m in enumerate(self.merchants)}

        def again(answer: Answer) -> tuple[str, int]:
            api = self.merchants[answer.merchant_id]
            payload = body(terminal_id=terminals[answer.merchant_id], amount=700)
            return answer.key, api.create(answer.key, payload).status_code

        with ThreadPoolExecutor(max_workers=8) as pool:
            return dict(pool.map(again, unanswered))

    def replay_unanswered(self) -> dict[str, tuple[int, str | None]]:
        """As ``retry_unanswered``: key → (status, the answered transaction's status)."""
        unanswered = [a for a in self.answers if a.status != 201]
        terminals = {m: f"T-{n:04d}" for n, m in enumerate(self.merchants)}

        def again(answer: Answer) -> tuple[str, tuple[int, str | None]]:
            api = self.merchants[answer.merchant_id]
            payload = body(terminal_id=terminals[answer.merchant_id], amount=700)
            response = api.create(answer.key, payload)
            status = response.json().get("status") if response.status_code == 201 else None
            return answer.key, (response.status_code, status)

        with ThreadPoolExecutor(max_workers=8) as pool:
            return dict(pool.map(again, unanswered))


def invariants(
    database_url: str,
    merchant_ids: list[str],
    approved: list[str],
    *,
    reported: Mapping[str, str] | None = None,
    acquirer_store: Path | None = None,
) -> InvariantReport:
    """contract §8 for these merchants; ``approved``: every key the fleet was answered 201
    approved, ``reported``: other keys' answered statuses; with ``acquirer_store``, the
    acquirer's side too."""

    async def run() -> InvariantReport:
        engine = create_engine(Settings(database_url=database_url))
        try:
            return await check_invariants(
                engine,
                merchant_ids=merchant_ids,
                reported={**dict.fromkeys(approved, "approved"), **(reported or {})},
                acquirer_store=acquirer_store,
            )
        finally:
            await engine.dispose()

    return asyncio.run(run())
