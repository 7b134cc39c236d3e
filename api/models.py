"""All tables. Singular snake_case names, ``_at`` timestamps, money as BigInteger minor units.

The exactly-once argument lives in three constraints:
- ``idempotency_key`` primary key (merchant_id, key): the claim; one winner per key.
- ``transaction`` primary key (merchant_id, id): one transaction per key.
- ``ledger_entry`` unique (merchant_id, transaction_id, kind): one charge per transaction.

Every primary key and unique constraint of a merchant's data contains ``merchant_id``, so on
Citus each table is distributed by it, colocated, and each of those constraints is enforced
inside one shard (``api.migrate.DISTRIBUTED``; merchants, API keys and the other small
tables are reference tables). SQLite keeps ``outbox_event.id`` as its one-column primary
key, the only kind it numbers by itself (migration 0008).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from api.db import Base, UTCDateTime


class Merchant(Base):
    __tablename__ = "merchant"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # The duplicate guard's window in seconds; None: off (contract §2.2, migration 0010).
    duplicate_guard_s: Mapped[int | None] = mapped_column(Integer, nullable=True)


class ApiKey(Base):
    __tablename__ = "api_key"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    merchant_id: Mapped[str] = mapped_column(String(40), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    __table_args__ = (
        ForeignKeyConstraint(["merchant_id"], ["merchant.id"], name="fk_api_key_merchant"),
    )


class IdempotencyKey(Base):
    """One row per (merchant, key): processing → completed | aborted | expired."""

    __tablename__ = "idempotency_key"
    merchant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    key: Mapped[str] = mapped_column(String(36), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    fingerprint: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_token: Mapped[int] = mapped_column(Integer, default=0)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    request: Mapped[str | None] = mapped_column(Text, nullable=True)
    response_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    response_body: Mapped[str | None] = mapped_column(Text, nullable=True)
    terminal_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    __table_args__ = (
        Index("ix_idempotency_key_state_lease_until", "state", "lease_until"),
        Index("ix_idempotency_key_state_updated_at", "state", "updated_at"),
    )


class Transaction(Base):
    __tablename__ = "transaction"
    merchant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    terminal_id: Mapped[str] = mapped_column(String(64))
    type: Mapped[str] = mapped_column(String(16))
    amount: Mapped[int] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(String(3))
    card_last4: Mapped[str] = mapped_column(String(4))
    card_brand: Mapped[str] = mapped_column(String(32))
    card_fingerprint: Mapped[str] = mapped_column(String(64))
    installments: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    decline_reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    authorization_code: Mapped[str | None] = mapped_column(String(16), nullable=True)
    captured_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    processed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    reversed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    metadata_json: Mapped[str | None] = mapped_column("metadata", Text, nullable=True)
    # An offline advice: sold by the terminal offline, forwarded later (contract §2.2).
    offline: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The guard found a suspect and the cashier confirmed the sale ("allow_duplicate": true).
    duplicate_override: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The listing's commit-ordered position (migration 0011; contract §2.7): set by the
    # database at insert — no insert names it — NULL on Citus, 0 for rows older than 0011.
    listing_pos: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The key's retrieval reference at the acquirer (field 37, contract §2.9): the lake's
    # join key with the clearing file. NULL for rows written before migration 0013.
    rrn: Mapped[str | None] = mapped_column(String(12), nullable=True)


# The terminal listing (GET /v1/transactions?terminal_id=…): keyset pages by (created_at, id).
Index(
    "ix_transaction_merchant_id_terminal_id_created_at",
    Transaction.merchant_id,
    Transaction.terminal_id,
    Transaction.created_at,
    Transaction.id,
)
# The duplicate guard's check (contract §2.2): one range probe per guarded create.
Index(
    "ix_transaction_duplicate_guard",
    Transaction.merchant_id,
    Transaction.terminal_id,
    Transaction.card_fingerprint,
    Transaction.amount,
    Transaction.created_at,
)


class LedgerEntry(Base):
    __tablename__ = "ledger_entry"
    merchant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    entry_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    transaction_id: Mapped[str] = mapped_column(String(36))
    amount: Mapped[int] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(String(3))
    kind: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    __table_args__ = (
        UniqueConstraint(
            "merchant_id", "transaction_id", "kind", name="uq_ledger_entry_transaction_kind"
        ),
        ForeignKeyConstraint(
            ["merchant_id", "transaction_id"],
            ["transaction.merchant_id", "transaction.id"],
            name="fk_ledger_entry_transaction",
        ),
    )


class RequestEvent(Base):
    __tablename__ = "request_event"
    merchant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    ts: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    terminal_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(36), nullable=True)
    endpoint: Mapped[str] = mapped_column(String(16))
    outcome: Mapped[str] = mapped_column(String(24))
    http_status: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    network: Mapped[str | None] = mapped_column(String(16), nullable=True)
    latency_ms: Mapped[float] = mapped_column(Float)
    exported_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class AcquirerAdvice(Base):
    """The reversal-advice queue (store and forward, contract §2.9): one row per key whose
    authorization must be undone at the acquirer — an in-doubt 0200 (``timeout``), a fenced
    claim whose 0200 may have left (``abort``), a reversal of an approval (``reversal``).
    Written in the transaction that settles the key; repeated (0420, then 0421) by the
    advice worker until a 0430 sets ``acknowledged_at``."""

    __tablename__ = "acquirer_advice"
    merchant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    key: Mapped[str] = mapped_column(String(36), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    rrn: Mapped[str] = mapped_column(String(12))
    terminal_id: Mapped[str] = mapped_column(String(64))
    type: Mapped[str] = mapped_column(String(16))
    amount: Mapped[int] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(String(3))
    original_stan: Mapped[str] = mapped_column(String(6))
    original_transmitted_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_error: Mapped[str | None] = mapped_column(String(200), nullable=True)
    acknowledged_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    __table_args__ = (Index("ix_acquirer_advice_pending", "acknowledged_at", "next_attempt_at"),)


class MerchantOutboxSeq(Base):
    """The relay's per-merchant sequence counter (only the leading relay writes it)."""

    __tablename__ = "merchant_outbox_seq"
    merchant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)


class OutboxEvent(Base):
    """Written in the same transaction as the change it announces; published by the relay."""

    __tablename__ = "outbox_event"
    merchant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    event_id: Mapped[str] = mapped_column(String(36))
    seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    type: Mapped[str] = mapped_column(String(32))
    transaction_id: Mapped[str] = mapped_column(String(36))
    payload: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    __table_args__ = (
        UniqueConstraint("merchant_id", "event_id", name="uq_outbox_event_merchant_event_id"),
        UniqueConstraint("merchant_id", "seq", name="uq_outbox_event_merchant_seq"),
        Index("ix_outbox_event_sent_at_id", "sent_at", "id"),
    )


class DatabaseEpoch(Base):
    """The database's identity for the Redis cache (contract §3.6): one row, written at
    ``idempay migrate`` and renewed by ``idempay admin new-epoch`` after a restore."""

    __tablename__ = "database_epoch"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[str] = mapped_column(String(36))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class WebhookEndpoint(Base):
    """A merchant's webhook receiver (``idempay admin webhook add``): every outbox event of
    the merchant numbered after ``enqueued_seq`` is queued for it (api/webhooks/)."""

    __tablename__ = "webhook_endpoint"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    merchant_id: Mapped[str] = mapped_column(String(40), index=True)
    url: Mapped[str] = mapped_column(Text)
    secret: Mapped[str] = mapped_column(String(128))
    enqueued_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    removed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    __table_args__ = (
        ForeignKeyConstraint(["merchant_id"], ["merchant.id"], name="fk_webhook_endpoint_merchant"),
    )


class WebhookDelivery(Base):
    """One outbox event for one endpoint: pending → delivered | dead (the dead-letter list)."""

    __tablename__ = "webhook_delivery"
    endpoint_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime())
    first_failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_error: Mapped[str | None] = mapped_column(String(200), nullable=True)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    dead_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    __table_args__ = (
        Index("ix_webhook_delivery_endpoint_id_seq", "endpoint_id", "seq"),
        ForeignKeyConstraint(
            ["endpoint_id"], ["webhook_endpoint.id"], name="fk_webhook_delivery_endpoint"
        ),
    )
