"""initial schema

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-21 20:09:44.846886
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "idempotency_key",
        sa.Column("merchant_id", sa.String(length=40), nullable=False),
        sa.Column("key", sa.String(length=36), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=True),
        sa.Column("lease_token", sa.Integer(), nullable=False),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("request", sa.Text(), nullable=True),
        sa.Column("response_status", sa.Integer(), nullable=True),
        sa.Column("response_body", sa.Text(), nullable=True),
        sa.Column("terminal_id", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("merchant_id", "key", name=op.f("pk_idempotency_key")),
    )
    with op.batch_alter_table("idempotency_key", schema=None) as batch_op:
        batch_op.create_index(
            "ix_idempotency_key_state_lease_until", ["state", "lease_until"], unique=False
        )
        batch_op.create_index(
            "ix_idempotency_key_state_updated_at", ["state", "updated_at"], unique=False
        )

    op.create_table(
        "issuer_authorization",
        sa.Column("issuer_key", sa.String(length=64), nullable=False),
        sa.Column("result", sa.String(length=16), nullable=False),
        sa.Column("decline_reason", sa.String(length=64), nullable=True),
        sa.Column("authorization_code", sa.String(length=16), nullable=True),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("calls", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("voided_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("issuer_key", name=op.f("pk_issuer_authorization")),
    )
    op.create_table(
        "merchant",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_merchant")),
        sa.UniqueConstraint("name", name=op.f("uq_merchant_name")),
    )
    op.create_table(
        "request_event",
        sa.Column("event_id", sa.String(length=36), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("merchant_id", sa.String(length=40), nullable=False),
        sa.Column("terminal_id", sa.String(length=64), nullable=True),
        sa.Column("idempotency_key", sa.String(length=36), nullable=True),
        sa.Column("endpoint", sa.String(length=16), nullable=False),
        sa.Column("outcome", sa.String(length=24), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("network", sa.String(length=16), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("exported_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_request_event")),
    )
    with op.batch_alter_table("request_event", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_request_event_ts"), ["ts"], unique=False)

    op.create_table(
        "transaction",
        sa.Column("merchant_id", sa.String(length=40), nullable=False),
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("terminal_id", sa.String(length=64), nullable=False),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("card_last4", sa.String(length=4), nullable=False),
        sa.Column("card_brand", sa.String(length=32), nullable=False),
        sa.Column("card_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("installments", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("decline_reason", sa.String(length=64), nullable=True),
        sa.Column("authorization_code", sa.String(length=16), nullable=True),
        sa.Column("captured_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("processed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reversed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("metadata", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("merchant_id", "id", name=op.f("pk_transaction")),
    )
    with op.batch_alter_table("transaction", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_transaction_created_at"), ["created_at"], unique=False)

    op.create_table(
        "api_key",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("merchant_id", sa.String(length=40), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["merchant_id"], ["merchant.id"], name="fk_api_key_merchant"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_key")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_key_key_hash")),
    )
    with op.batch_alter_table("api_key", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_key_merchant_id"), ["merchant_id"], unique=False)

    op.create_table(
        "ledger_entry",
        sa.Column("entry_id", sa.String(length=36), nullable=False),
        sa.Column("merchant_id", sa.String(length=40), nullable=False),
        sa.Column("transaction_id", sa.String(length=36), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["merchant_id", "transaction_id"],
            ["transaction.merchant_id", "transaction.id"],
            name="fk_ledger_entry_transaction",
        ),
        sa.PrimaryKeyConstraint("entry_id", name=op.f("pk_ledger_entry")),
        sa.UniqueConstraint(
            "merchant_id", "transaction_id", "kind", name="uq_ledger_entry_transaction_kind"
        ),
    )
    with op.batch_alter_table("ledger_entry", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_ledger_entry_created_at"), ["created_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("ledger_entry", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ledger_entry_created_at"))

    op.drop_table("ledger_entry")
    with op.batch_alter_table("api_key", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_key_merchant_id"))

    op.drop_table("api_key")
    with op.batch_alter_table("transaction", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_transaction_created_at"))

    op.drop_table("transaction")
    with op.batch_alter_table("request_event", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_request_event_ts"))

    op.drop_table("request_event")
    op.drop_table("merchant")
    op.drop_table("issuer_authorization")
    with op.batch_alter_table("idempotency_key", schema=None) as batch_op:
        batch_op.drop_index("ix_idempotency_key_state_updated_at")
        batch_op.drop_index("ix_idempotency_key_state_lease_until")

    op.drop_table("idempotency_key")
