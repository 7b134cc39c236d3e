"""The delegated calls on Citus (api/transactions/delegated.py) name the columns of the rows
the create builds — its claim row, its transaction row, ledger entry and outbox event — in
their PL/pgSQL, from constants kept next to the builders. A builder that gains or loses a
column without its constant would insert NULL there (or fail on Citus only): each builder's
row has exactly its constant's columns."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy.ext.asyncio import AsyncConnection

from api import deferred
from api.idempotency import store
from api.outbox import writer as outbox
from api.transactions import delegated, repository

NOW = datetime(2026, 11, 30, tzinfo=UTC)


def test_the_claim_row_has_the_claim_columns() -> None:
    row = store.claim_row(
        merchant_id="m",
        key="k",
        fingerprint="f",
        request="{}",
        terminal_id="T",
        now=NOW,
        lease_until=NOW,
        deadline_s=60,
    )
    assert tuple(row) == store.CLAIM_COLUMNS


async def test_the_finish_rows_have_the_finish_tables_columns() -> None:
    class Collector:  # stands for the connection: deferred.insert only collects on it
        pass

    conn = cast(AsyncConnection, Collector())
    deferred.collect(conn)
    txn = repository.NewTransaction(
        merchant_id="m",
        id="k",
        terminal_id="T",
        type="purchase",
        amount=700,
        currency="BRL",
        card_last4="4242",
        card_brand="visa",
        card_fingerprint="fp",
        installments=1,
        status="approved",
        decline_reason=None,
        authorization_code="A1",
        captured_at=NOW,
        created_at=NOW,
        processed_at=NOW,
        metadata_json=None,
    )
    await repository.insert_transaction(conn, txn)
    await outbox.append(
        conn, merchant_id="m", event_type=outbox.COMPLETED, transaction_id="k", data={}, now=NOW
    )
    rows: dict[str, list[dict[str, Any]]] = deferred.take(conn)
    assert set(rows) == set(delegated.FINISH_TABLES)
    for table, batch in rows.items():
        columns, key_column = delegated.FINISH_TABLES[table]
        assert [set(row) for row in batch] == [set(columns)], table
        assert key_column in columns
