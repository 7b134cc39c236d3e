"""Review finding A (issue 16, contract §2.2, §2.9, §4.12): the server's own fence must
never apply to an offline advice — the terminal already sold, the customer has the goods.

Before the fix, a forwarded advice whose issuer did not answer within
``IDEMPAY_ISSUER_DEADLINE`` was voided and fenced ``aborted`` by the completer, and the
stored sale was lost for good. These tests drive the completer directly, on both backends,
with an acquirer that does not answer, then comes back: the advice (its 0220 sent by an owner
that is gone) stays ``processing`` past its deadline, its advice is repeated as a 0221 — never
a 0200 — and the sale completes once the acquirer answers. An online key whose owner is gone
is settled declined / ``acquirer_timeout`` with its 0420 reversal advice queued, never sent
again and never fenced by the server; a client's abort of an in-flight advice is refused
(409), and an operator's fence still fences it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from api.acquirer.types import (
    Authorization,
    AuthorizationRequest,
    InDoubt,
    ReversalRequest,
)
from api.db import atomic, utcnow
from api.idempotency.store import KeyRecord
from api.transactions import recovery, resolution
from api.transactions.completer import Completer
from api.transactions.recovery import Recovered
from api.transactions.schemas import TransactionCreate
from api.transactions.service import TransactionService
from tests.support.backend import Backend
from tests.support.client import body, card
from tests.support.transaction_service import claim_key, running_service


class OutageAcquirer:
    """The acquirer side of the link (``acquire.Acquirer``) during an outage: while
    ``down`` nothing is answered (every message is in doubt, as the link reports a request
    unanswered within its timeout); back up, it approves. Every message is recorded as
    (MTI, RRN)."""

    def __init__(self) -> None:
        self.down = True
        self.sent: list[tuple[str, str]] = []

    def _answer(self, mti: str, rrn: str) -> Authorization:
        self.sent.append((mti, rrn))
        if self.down:
            raise InDoubt(f"no answer to the {mti}", stan="000042")
        return Authorization(
            approved=True,
            authorization_code="A00042",
            decline_reason=None,
            response_code="00",
            stan="000042",
        )

    async def authorize(self, req: AuthorizationRequest, *, timeout_s: float) -> Authorization:
        return self._answer("0200", req.rrn)

    async def advise_sale(
        self, req: AuthorizationRequest, *, repeat: bool, timeout_s: float
    ) -> Authorization:
        return self._answer("0221" if repeat else "0220", req.rrn)

    async def reverse(self, req: ReversalRequest, *, timeout_s: float) -> bool:
        self.sent.append(("0400", req.rrn))
        return not self.down

    async def advise(self, req: ReversalRequest, *, timeout_s: float) -> bool:
        self.sent.append(("0421" if req.repeat else "0420", req.rrn))
        return not self.down

    def of(self, rrn: str) -> list[str]:
        return [mti for mti, sent_rrn in self.sent if sent_rrn == rrn]


@pytest.fixture
async def service(private_backend: Backend) -> AsyncIterator[TransactionService]:
    """On a database of this test's own: the suite's shared databases have servers whose
    completers re-drive any expired lease they find — one taking this test's key over first
    made ``recover`` answer LOST, and an operator's abort meet a live lease (409), in CI."""
    async with running_service(
        private_backend,
        OutageAcquirer(),
        db_pool_size=2,  # Postgres is shared
        answer_within=0.3,
        lease_seconds=30.0,
        issuer_deadline=60.0,
    ) as service:
        yield service


def _payment(*, advice: bool) -> TransactionCreate:
    extra: dict[str, Any] = {}
    if advice:
        captured = datetime.now(UTC) - timedelta(minutes=30)
        extra = {"entry_mode": "offline", "captured_at": captured.isoformat()}
    return TransactionCreate.model_validate(body(card=card("tok_visa_4242"), **extra))


async def _past_deadline(service: TransactionService, payment: TransactionCreate) -> KeyRecord:
    """A key claimed 2 minutes ago (its issuer deadline, 60 s, long past) whose owner is gone
    (lease expired) after its 0200 or 0220 left: what the completer finds after an outage."""
    merchant, key = f"mer_adv_{uuid.uuid4().hex[:12]}", str(uuid.uuid4())
    claimed_at = utcnow() - timedelta(minutes=2)
    await claim_key(service, merchant, key, payment, now=claimed_at, lease_s=1.0)
    record = await service.read(merchant, key)
    assert record is not None and record.deadline_at is not None
    assert record.deadline_at < utcnow() and not record.lease_live(utcnow())
    return record


async def _lease_runs_out(service: TransactionService, record: KeyRecord) -> None:
    async with atomic(service.engine) as conn:
        await conn.execute(
            text(
                "UPDATE idempotency_key SET lease_until = :t"
                " WHERE merchant_id = :m AND key = :k AND state = 'processing'"
            ),
            {"t": utcnow() - timedelta(seconds=1), "m": record.merchant_id, "k": record.key},
        )


async def _count(service: TransactionService, statement: str, **params: Any) -> int:
    async with service.engine.connect() as conn:
        return int((await conn.execute(text(statement), params)).scalar_one())


def _completer(service: TransactionService) -> Completer:
    return Completer(service, interval=0.05, slots=4)


def _acquirer(service: TransactionService) -> OutageAcquirer:
    assert isinstance(service.acquirer, OutageAcquirer)
    return service.acquirer


async def _advices(service: TransactionService, record: KeyRecord) -> list[str]:
    async with service.engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT kind FROM acquirer_advice WHERE merchant_id = :m AND key = :k"),
            {"m": record.merchant_id, "k": record.key},
        )
        return [str(kind) for (kind,) in rows]


async def test_an_advice_past_the_issuer_deadline_is_not_fenced_and_completes_later(
    service: TransactionService,
) -> None:
    acquirer = _acquirer(service)
    record = await _past_deadline(service, _payment(advice=True))
    rrn = service.rrn(record.merchant_id, record.key)
    completer = _completer(service)
    assert await completer.run_once() == 1
    assert completer.recovered[Recovered.ABORTED] == 0
    assert completer.recovered[Recovered.PENDING] == 1
    now = await service.must_read(record.merchant_id, record.key)
    assert now.state == "processing"  # not fenced: the terminal already sold
    assert acquirer.of(rrn) == ["0221"]  # its advice repeated, never a 0200
    # its backoff is held in its lease: not due (nor read) again before then
    assert now.lease_until is not None and now.lease_until > utcnow()
    assert await completer.run_once() == 0
    # the outage goes on: due again, repeated again, still never fenced
    await _lease_runs_out(service, record)
    completer._backoff.clear()
    assert await completer.run_once() == 1
    assert completer.recovered[Recovered.ABORTED] == 0
    assert (await service.must_read(record.merchant_id, record.key)).state == "processing"
    assert acquirer.of(rrn) == ["0221", "0221"]
    # the acquirer is back: the next repeat (same RRN) completes the sale
    acquirer.down = False
    await _lease_runs_out(service, record)
    completer._backoff.clear()
    assert await completer.run_once() == 1
    assert completer.recovered[Recovered.COMPLETED] == 1
    done = await service.must_read(record.merchant_id, record.key)
    assert done.state == "completed"
    where = {"m": record.merchant_id, "k": record.key}
    txn = 'SELECT COUNT(*) FROM "transaction" WHERE merchant_id = :m AND id = :k'
    assert await _count(service, txn + " AND offline AND status = 'approved'", **where) == 1
    charge = (
        "SELECT COUNT(*) FROM ledger_entry WHERE merchant_id = :m"
        " AND transaction_id = :k AND kind = 'charge'"
    )
    assert await _count(service, charge, **where) == 1
    assert acquirer.of(rrn) == ["0221", "0221", "0221"]
    assert await _advices(service, record) == []  # nothing reversed: the sale stands


async def test_an_online_key_past_the_issuer_deadline_is_settled_in_doubt_not_fenced(
    service: TransactionService,
) -> None:
    """Its 0200 may have left: the completer never sends another — the key settles declined
    / acquirer_timeout with its 0420 reversal advice queued in the same commit."""
    acquirer = _acquirer(service)
    record = await _past_deadline(service, _payment(advice=False))
    completer = _completer(service)
    assert await completer.run_once() == 1
    assert completer.recovered[Recovered.ABORTED] == 0
    assert completer.recovered[Recovered.COMPLETED] == 1
    assert (await service.must_read(record.merchant_id, record.key)).state == "completed"
    where = {"m": record.merchant_id, "k": record.key}
    declined = (
        'SELECT COUNT(*) FROM "transaction" WHERE merchant_id = :m AND id = :k'
        " AND status = 'declined' AND decline_reason = 'acquirer_timeout'"
    )
    assert await _count(service, declined, **where) == 1
    assert await _advices(service, record) == ["timeout"]
    assert acquirer.of(service.rrn(record.merchant_id, record.key)) == []  # no 0200 again


async def test_a_retry_of_an_advice_past_its_deadline_is_not_fenced(
    service: TransactionService,
) -> None:
    """The other way into recovery: a create's retry finds the expired lease
    (``TransactionService.existing``) — the forwarding terminal's own resend."""
    record = await _past_deadline(service, _payment(advice=True))
    recovered = await recovery.recover(service, record, now=utcnow())
    assert recovered.result == Recovered.PENDING
    assert (await service.must_read(record.merchant_id, record.key)).state == "processing"
    assert _acquirer(service).of(service.rrn(record.merchant_id, record.key)) == ["0221"]


async def test_a_clients_abort_never_fences_an_advice_an_operators_does(
    service: TransactionService,
) -> None:
    record = await _past_deadline(service, _payment(advice=True))
    refused = await resolution.abort(service, record.merchant_id, record.key)
    assert refused.status == 409, refused.body
    # a Prefer: wait abort looks again when the re-drive's lease ends (at least 1 s), not
    # every 50 ms as for an abort that is about to take over
    assert refused.recheck_s is not None and refused.recheck_s >= 1.0
    assert (await service.must_read(record.merchant_id, record.key)).state == "processing"
    online = await _past_deadline(service, _payment(advice=False))
    fenced = await resolution.abort(service, online.merchant_id, online.key)
    assert fenced.status == 200 and b"aborted" in fenced.body
    assert await _advices(service, online) == ["abort"]  # its 0200 may have left
    again = await service.must_read(record.merchant_id, record.key)
    await _lease_runs_out(service, again)
    again = await service.must_read(record.merchant_id, record.key)
    by_operator = await resolution.abort(
        service, again.merchant_id, again.key, reason="issuer gone for good"
    )
    assert by_operator.status == 200 and b"aborted" in by_operator.body
    assert (await service.must_read(record.merchant_id, record.key)).state == "aborted"


async def test_a_clients_abort_never_takes_a_live_lease_from_an_advices_re_drive(
    service: TransactionService,
) -> None:
    """Past the answer time an abort may take a live lease over (to fence an online key);
    an advice's running repeat keeps it — its answer is not refused."""
    record = await _past_deadline(service, _payment(advice=True))
    token = await recovery.take_over(service, record, now=utcnow())  # a re-drive starts
    assert token is not None
    running = await service.must_read(record.merchant_id, record.key)
    assert running.lease_live(utcnow()) and running.lease_token == token
    refused = await resolution.abort(service, record.merchant_id, record.key)
    assert refused.status == 409, refused.body
    after = await service.must_read(record.merchant_id, record.key)
    assert (after.state, after.lease_token) == ("processing", token)
