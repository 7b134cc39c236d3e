"""The duplicate guard end to end (contract §2.2, §4.13): both clients against the real
server (a uvicorn process) on Postgres and on SQLite, the merchant's guard on.

The same sale rung up twice: the second is refused 409 ``suspected_duplicate``; the SDK
fences its key — a late copy of it is answered 410 from then on — and raises
``SuspectedDuplicateError`` naming the first; the cashier's override sells under a new key.
One charge per approved payment, none for the refused one."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from integration_db import Merchant

from client_sdk import (
    AsyncClient,
    Client,
    JournalState,
    RetryPolicy,
    SuspectedDuplicateError,
    Transaction,
)
from tests.support.backend import Backend
from tests.support.services import Server

CARD = {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}
SALE = {"amount": 3150, "currency": "BRL", "card": CARD, "deadline_s": 30}
WINDOW_S = 120


def terminal(tmp_path: Path) -> dict[str, Any]:
    """The terminal's settings, the same for both clients."""
    return {
        "terminal_id": "T-GUARD",
        "journal": tmp_path / "pos.db",
        "retry": RetryPolicy(base=0.02, cap=0.2),
    }


def guarded_merchant(backend: Backend, name: str) -> Merchant:
    """A merchant of the test's own whose guard is on, set before its first request (the
    server reads the setting with the API key)."""
    merchant = Merchant.create(backend, f"{name}-{uuid.uuid4().hex[:8]}")
    backend.sql(
        "UPDATE merchant SET duplicate_guard_s = :w WHERE id = :m", w=WINDOW_S, m=merchant.id
    )
    return merchant


def test_a_sale_rung_up_twice_is_refused_fenced_and_can_be_overridden(
    backend: Backend, server: Server, tmp_path: Path
) -> None:
    merchant = guarded_merchant(backend, "guard-sdk")
    with Client(server.url, merchant.api_key, **terminal(tmp_path)) as pos:
        first = pos.purchase(**SALE)
        with pytest.raises(SuspectedDuplicateError) as caught:
            pos.purchase(**SALE)
        refused = caught.value
        entry = pos.journal.get(refused.key)
        confirmed = pos.purchase(**SALE, allow_duplicate=True)
    assert first.status == "approved" and confirmed.status == "approved"
    assert refused.duplicate_of == first.id
    assert (refused.code, refused.status) == ("suspected_duplicate", 409)
    assert entry is not None and entry.state is JournalState.ABORTED
    assert merchant.key_states()[refused.key] == "aborted"  # fenced by the SDK's abort
    assert merchant.transactions() == {first.id: "approved", confirmed.id: "approved"}
    assert merchant.charges() == {first.id: 1, confirmed.id: 1}
    [(override,)] = backend.sql(
        'SELECT duplicate_override FROM "transaction" WHERE id = :k', k=confirmed.id
    )
    assert override in (True, 1)  # the guard found a suspect and the cashier overrode it

    # A late copy of the refused attempt (the network held it) is refused for good now —
    # even once the first sale has left the window, which is why the SDK fenced the key.
    with httpx.Client(base_url=server.url) as raw:
        late = raw.post(
            "/v1/transactions",
            content=entry.request_json,
            headers={
                "Authorization": f"Bearer {merchant.api_key}",
                "Idempotency-Key": refused.key,
                "Content-Type": "application/json",
            },
        )
    assert late.status_code == 410, late.text
    assert late.json()["code"] == "transaction_aborted"


def test_the_async_client_is_refused_and_overrides_the_same(
    backend: Backend, server: Server, tmp_path: Path
) -> None:
    merchant = guarded_merchant(backend, "guard-sdk-async")  # (the backend's helpers block)

    async def sell() -> tuple[Transaction, SuspectedDuplicateError, Transaction, Transaction]:
        async with AsyncClient(server.url, merchant.api_key, **terminal(tmp_path)) as pos:
            first = await pos.purchase(**SALE)
            with pytest.raises(SuspectedDuplicateError) as caught:
                await pos.purchase(**SALE)
            confirmed = await pos.purchase(**SALE, allow_duplicate=True)
            refund = await pos.refund(**SALE)  # refunds are never guarded
        return first, caught.value, confirmed, refund

    first, refused, confirmed, refund = asyncio.run(sell())
    assert refused.duplicate_of == first.id
    assert merchant.key_states()[refused.key] == "aborted"
    assert merchant.transactions() == {
        first.id: "approved",
        confirmed.id: "approved",
        refund.id: "approved",
    }
