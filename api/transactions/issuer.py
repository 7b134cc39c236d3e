"""The issuer interface and the built-in simulator (test tokens in the spirit of Stripe's).

Test tokens: ``tok_*`` approves; ``tok_decline_insufficient_funds`` and
``tok_decline_do_not_honor`` decline with that reason; ``tok_issuer_slow`` answers after
``IDEMPAY_ISSUER_SLOW_SECONDS`` (~2 s); ``tok_issuer_timeout`` does not answer the first
call for an issuer key and answers the next; ``tok_issuer_down`` never answers.

The simulator honours the issuer idempotency key: it records the authorization under that
key the moment it receives the call, and any later call with the same key returns the
recorded answer — a re-driven call never authorizes twice. Its record lives in the
``issuer_authorization`` table: a co-located issuer enlists in the caller's transaction
(``conn=``) so its record commits or rolls back with the payment; called without a
connection it commits on its own, as a remote acquirer would.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.db import atomic, insert_if_absent, utcnow
from api.models import IssuerAuthorization

SLOW_TOKENS = frozenset({"tok_issuer_slow", "tok_issuer_timeout", "tok_issuer_down"})
DECLINES = {
    "tok_decline_insufficient_funds": "insufficient_funds",
    "tok_decline_do_not_honor": "do_not_honor",
}


@dataclass(frozen=True, slots=True)
class AuthorizationRequest:
    merchant_id: str  # whose record: it lives on the merchant's shard on Citus
    issuer_key: str
    card_token: str
    amount: int
    currency: str
    type: str


@dataclass(frozen=True, slots=True)
class Authorization:
    approved: bool
    authorization_code: str | None
    decline_reason: str | None


class Issuer(Protocol):
    def answers_inline(self, card_token: str) -> bool:
        """True when the answer needs no waiting, so claim and finish may share one commit."""

    async def authorize(
        self, request: AuthorizationRequest, *, conn: AsyncConnection | None = None
    ) -> Authorization:
        """Authorize once per ``issuer_key``; repeated calls return the first answer."""

    async def void(
        self,
        issuer_key: str,
        *,
        merchant_id: str,
        amount: int,
        currency: str,
        conn: AsyncConnection | None = None,
    ) -> None:
        """Cancel whatever was authorized under ``issuer_key`` (idempotent). A co-located
        issuer enlists in ``conn`` so the void commits with the fence, or not at all."""


# A legacy record (merchant '') moves to its merchant unless the merchant has one already.
ADOPT = text(
    "UPDATE issuer_authorization SET merchant_id = :m WHERE merchant_id = '' AND issuer_key = :k"
    " AND NOT EXISTS (SELECT 1 FROM issuer_authorization WHERE merchant_id = :m"
    " AND issuer_key = :k)"
)


def derive_issuer_key(secret: str, merchant_id: str, key: str) -> str:
    """The downstream idempotency key: stable for (merchant, key), opaque to the issuer."""
    message = f"{merchant_id}:{key}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()[:40]


def _decide(issuer_key: str, card_token: str) -> Authorization:
    reason = DECLINES.get(card_token)
    if reason:
        return Authorization(approved=False, authorization_code=None, decline_reason=reason)
    digest = hashlib.sha256(issuer_key.encode()).hexdigest().upper()
    return Authorization(approved=True, authorization_code=digest[:6], decline_reason=None)


class SimulatedIssuer:
    """``citus``: the database has Citus (the app's start-up probe, ``api.main``); there no
    legacy record is ever adopted."""

    def __init__(self, engine: AsyncEngine, *, slow_seconds: float, citus: bool = False) -> None:
        self._engine = engine
        self._slow_seconds = slow_seconds
        self._citus = citus

    def answers_inline(self, card_token: str) -> bool:
        return card_token not in SLOW_TOKENS

    def decide(self, issuer_key: str, card_token: str) -> Authorization:
        """The answer a first call for an inline token records, with no I/O: for a caller
        that writes this simulator's record in its own statement (the one-write create,
        ``api/transactions/inline.py``). A repeated call still goes through ``authorize``."""
        return _decide(issuer_key, card_token)

    async def authorize(
        self, request: AuthorizationRequest, *, conn: AsyncConnection | None = None
    ) -> Authorization:
        if request.card_token == "tok_issuer_down":
            await asyncio.Event().wait()  # never answers; the caller's timeout cancels us
        if conn is not None:
            record, calls = await self._record(conn, request)
        else:
            async with atomic(self._engine) as own:
                record, calls = await self._record(own, request)
        if request.card_token == "tok_issuer_slow":
            await asyncio.sleep(self._slow_seconds)
        elif request.card_token == "tok_issuer_timeout" and calls == 1:
            await asyncio.Event().wait()  # the first call for a key never answers
        return record

    async def _record(
        self, conn: AsyncConnection, request: AuthorizationRequest
    ) -> tuple[Authorization, int]:
        decided = _decide(request.issuer_key, request.card_token)
        await self._adopt(conn, request.merchant_id, request.issuer_key)
        inserted = await insert_if_absent(
            conn,
            IssuerAuthorization,
            {
                "merchant_id": request.merchant_id,
                "issuer_key": request.issuer_key,
                "result": "approved" if decided.approved else "declined",
                "decline_reason": decided.decline_reason,
                "authorization_code": decided.authorization_code,
                "amount": request.amount,
                "currency": request.currency,
                "calls": 1,
                "created_at": utcnow(),
            },
        )
        if inserted:
            return decided, 1
        row = (
            await conn.execute(
                update(IssuerAuthorization)
                .where(
                    IssuerAuthorization.merchant_id == request.merchant_id,
                    IssuerAuthorization.issuer_key == request.issuer_key,
                )
                .values(calls=IssuerAuthorization.calls + 1)
                .returning(
                    IssuerAuthorization.result,
                    IssuerAuthorization.authorization_code,
                    IssuerAuthorization.decline_reason,
                    IssuerAuthorization.calls,
                )
            )
        ).one()
        answer = Authorization(
            approved=row.result == "approved",
            authorization_code=row.authorization_code,
            decline_reason=row.decline_reason,
        )
        return answer, row.calls

    async def void(
        self,
        issuer_key: str,
        *,
        merchant_id: str,
        amount: int,
        currency: str,
        conn: AsyncConnection | None = None,
    ) -> None:
        if conn is not None:
            await self._void(conn, issuer_key, merchant_id, amount=amount, currency=currency)
            return
        async with atomic(self._engine) as own:
            await self._void(own, issuer_key, merchant_id, amount=amount, currency=currency)

    async def _void(
        self,
        conn: AsyncConnection,
        issuer_key: str,
        merchant_id: str,
        *,
        amount: int,
        currency: str,
    ) -> None:
        now = utcnow()
        legacy = await self._adopt(conn, merchant_id, issuer_key)  # True: void it as well
        inserted = await insert_if_absent(
            conn,
            IssuerAuthorization,
            {
                "merchant_id": merchant_id,
                "issuer_key": issuer_key,
                "result": "voided",
                "amount": amount,
                "currency": currency,
                "calls": 0,
                "created_at": now,
                "voided_at": now,
            },
        )
        if not inserted:
            await conn.execute(
                update(IssuerAuthorization)
                .where(
                    IssuerAuthorization.merchant_id == merchant_id,
                    IssuerAuthorization.issuer_key == issuer_key,
                    IssuerAuthorization.voided_at.is_(None),
                )
                .values(result="voided", voided_at=now)
            )
        if legacy:  # an older replica's record may sit beside ours: the same key's, void it
            await conn.execute(
                update(IssuerAuthorization)
                .where(
                    IssuerAuthorization.merchant_id == "",
                    IssuerAuthorization.issuer_key == issuer_key,
                    IssuerAuthorization.voided_at.is_(None),
                )
                .values(result="voided", voided_at=now)
            )

    async def _adopt(self, conn: AsyncConnection, merchant_id: str, issuer_key: str) -> bool:
        """Plain Postgres and SQLite: a record an older replica wrote under merchant ``''``
        (code before 7c2ea99; migration 0012 re-homed the ones stored before it ran) moves to
        its merchant when the merchant has none, so a re-drive finds its first answer and a
        void voids it — one statement, a primary-key probe. True when it ran: a ``''`` record
        may remain beside the merchant's own (an older replica wrote it after ours), and a
        void cancels it too. Never on Citus (False): its hot path stays single-shard, and no
        code before 7c2ea99 served a Citus database.

        Sent on every call, not only while a ``''`` record is known to be stored: a cached
        "none stored" let an older replica's record written just after the look be missed —
        an abort that left the approval standing, a re-drive that authorized twice, a
        reversal that voided nothing (review s6, tests/api/review_s6). The UPDATE runs on the
        general path only (the one-write create never calls it) and can go one release after
        every replica runs 0012's code (docs/operations.md)."""
        if not merchant_id or self._citus:
            return False
        await conn.execute(ADOPT, {"m": merchant_id, "k": issuer_key})
        return True
