"""The relay numbers a transaction's reversal after its completion even when the reversal's
outbox id is the lower one — as on Citus, where rows inserted on a worker take ids from that
node's range, and a moved shard's rows from another node's (issue 18). Both storage
backends; no Redis (``number_committed`` numbers under the relay's rules without publishing).
"""

from __future__ import annotations

import asyncio

import pytest

from api.db import create_engine
from api.outbox.relay import number_committed
from tests.support.backend import Backend

ROWS = [  # (id, merchant, transaction, type): the reversal's id below its completion's
    (50, "mer_causal", "txn-1", "transaction.reversed"),
    (60, "mer_other", "txn-9", "transaction.completed"),
    (100, "mer_causal", "txn-1", "transaction.completed"),
    (110, "mer_causal", "txn-2", "transaction.completed"),
]


def _seed(backend: Backend) -> None:
    for row_id, merchant, txn, kind in ROWS:
        backend.sql(
            "INSERT INTO outbox_event (id, event_id, merchant_id, type, transaction_id, "
            "payload, created_at) VALUES (:id, :event, :merchant, :type, :txn, '{}', "
            "CURRENT_TIMESTAMP)",
            id=row_id,
            event=f"ev-{row_id}",
            merchant=merchant,
            type=kind,
            txn=txn,
        )


def _seqs(backend: Backend) -> dict[int, int | None]:
    return dict(backend.sql("SELECT id, seq FROM outbox_event"))  # type: ignore[arg-type]


@pytest.mark.parametrize("batch", [1, 2, 10])
def test_a_reversal_is_numbered_after_its_completion(private_backend: Backend, batch: int) -> None:
    _seed(private_backend)

    async def number_all() -> None:
        engine = create_engine(private_backend.settings)
        try:
            while await number_committed(engine, batch=batch):
                pass
        finally:
            await engine.dispose()

    asyncio.run(number_all())
    seqs = _seqs(private_backend)
    assert None not in seqs.values()
    assert seqs[100] < seqs[50]  # txn-1: completed, then reversed
    causal = sorted(seqs[i] or 0 for i in (50, 100, 110))
    assert causal == [1, 2, 3]  # one merchant's numbers: gapless from 1
    assert seqs[60] == 1  # another merchant counts on its own
