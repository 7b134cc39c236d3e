"""What ``Client`` and ``AsyncClient`` share: configuration, the journal, building the
protocol's steps, and translating between httpx and the protocol's replies."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Literal

import httpx

from ._effects import Begin, HttpReply, NoReply, Record, Send, Steps
from ._journal import Journal, JournalEntry
from ._keys import uuid7
from ._models import Card, Transaction, card_from
from ._protocol import Context, pay
from ._request import build_body
from ._retry import RetryPolicy

__all__ = ["NETWORKS", "BaseClient", "no_reply", "reply_from"]

NETWORKS = frozenset({"gprs", "3g", "4g", "wifi", "ethernet", "other"})
# The server's Date header has a resolution of one second: a smaller offset is noise.
CLOCK_SKEW_TOLERANCE_S = 2.0
MAX_CLOCK_SAMPLE_RTT_S = 2.0  # a slower round trip says too little about the server's clock
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


def reply_from(response: httpx.Response) -> HttpReply:
    try:
        body: object = response.json()
    except ValueError:
        body = None
    headers = {name.lower(): value for name, value in response.headers.items()}
    return HttpReply(response.status_code, headers, body)


def no_reply(exc: httpx.TransportError) -> NoReply:
    """Connect errors certainly happened before sending; anything else is in doubt."""
    return NoReply(sent=not isinstance(exc, _NOT_SENT), error=f"{type(exc).__name__}: {exc}")


def send_kwargs(effect: Send) -> dict[str, Any]:
    return {"headers": dict(effect.headers), "content": effect.content, "timeout": effect.timeout}


class BaseClient:
    def __init__(
        self,
        api_key: str,
        *,
        terminal_id: str,
        journal: str | os.PathLike[str] | Journal,
        network: str | None,
        timeout: float,
        base_backoff: float,
        max_backoff: float,
        abort_grace_s: float,
        max_retries: int,
        send_expires_at: bool,
        seed: int | None,
        clock: Callable[[], float] | None,
    ) -> None:
        if network is not None and network not in NETWORKS:
            raise ValueError(f"network must be one of {sorted(NETWORKS)}")
        if timeout <= 0 or abort_grace_s < 0 or max_retries < 0:
            raise ValueError("timeout must be > 0; abort_grace_s and max_retries >= 0")
        headers = {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}
        if network is not None:
            headers["POS-Network"] = network
        self.terminal_id = terminal_id
        self.max_retries = max_retries
        self.send_expires_at = send_expires_at
        self._owns_journal = not isinstance(journal, Journal)
        self.journal = journal if isinstance(journal, Journal) else Journal(journal)
        self._ctx = Context(
            headers=headers,
            timeout=timeout,
            policy=RetryPolicy(base=base_backoff, cap=max_backoff),
            abort_grace_s=abort_grace_s,
            clock=clock or time.time,
            rng=random.Random(seed),
        )
        self._active: set[str] = set()
        self._active_lock = threading.Lock()
        self.clock_offset_s: float | None = None  # server clock − ours, from Date headers

    def _observe_clock(self, response: httpx.Response, sent_at: float) -> None:
        """Estimate how far the server's clock is from ours, NTP-style, so that
        ``expires_at`` — a deadline the server compares with its own clock — survives a
        terminal whose clock is off: the ``Date`` header (truncated to the second: +0.5 s)
        against the middle of the round trip. Only quick round trips count: an answer the
        network held for seconds would skew the estimate by as much."""
        date = response.headers.get("date")
        if not date:
            return
        received_at = self._ctx.clock()
        if not 0 <= received_at - sent_at <= MAX_CLOCK_SAMPLE_RTT_S:
            return
        try:
            server = parsedate_to_datetime(date).timestamp() + 0.5
        except (TypeError, ValueError, IndexError, OverflowError):
            return
        self.clock_offset_s = server - (sent_at + received_at) / 2

    def _server_now(self, local: float) -> float:
        offset = self.clock_offset_s
        if offset is None or abs(offset) < CLOCK_SKEW_TOLERANCE_S:
            return local
        return local + offset

    def _payment(
        self,
        kind: Literal["purchase", "refund"],
        *,
        amount: int,
        currency: str,
        card: Card | Mapping[str, str],
        deadline_s: float,
        installments: int | None,
        metadata: Mapping[str, Any] | None,
        captured_at: datetime | None,
        reverse_late_approval: bool,
    ) -> tuple[str, Steps[Transaction]]:
        """Mint the key once and build the steps; nothing is written or sent yet."""
        if deadline_s <= 0:
            raise ValueError("deadline_s must be > 0")
        started = self._ctx.clock()
        now = datetime.fromtimestamp(started, UTC)
        server_now = datetime.fromtimestamp(self._server_now(started), UTC)
        expires = server_now + timedelta(seconds=deadline_s) if self.send_expires_at else None
        body = build_body(
            terminal_id=self.terminal_id,
            kind=kind,
            amount=amount,
            currency=currency,
            card=card_from(card),
            installments=installments,
            metadata=metadata,
            captured_at=captured_at or now,
            expires_at=expires,
        )
        key = str(uuid7(unix_ms=int(started * 1000)))
        steps = pay(
            self._ctx,
            key=key,
            request_json=body,
            deadline=started + deadline_s,
            reverse_late_approval=reverse_late_approval,
        )
        return key, steps

    def _write(self, effect: Begin | Record) -> JournalEntry:
        if isinstance(effect, Begin):
            return self.journal.begin(
                effect.key,
                effect.request_json,
                deadline=effect.deadline,
                reverse_late_approval=effect.reverse_late_approval,
            )
        return self.journal.transition(
            effect.key, effect.state, attempts=effect.attempts, outcome=effect.outcome
        )

    def _claim(self, key: str) -> bool:
        """Mark a key as driven by this process; False if something already drives it."""
        with self._active_lock:
            if key in self._active:
                return False
            self._active.add(key)
            return True

    def _release(self, key: str) -> None:
        with self._active_lock:
            self._active.discard(key)

    def _close_journal(self) -> None:
        if self._owns_journal:
            self.journal.close()
