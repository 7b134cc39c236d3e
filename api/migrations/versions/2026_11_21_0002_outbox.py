"""outbox

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 20:36:45.437291
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "merchant_outbox_seq",
        sa.Column("merchant_id", sa.String(length=40), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("merchant_id", name=op.f("pk_merchant_outbox_seq")),
    )
    op.create_table(
        "outbox_event",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("event_id", sa.String(length=36), nullable=False),
        sa.Column("merchant_id", sa.String(length=40), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=True),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("transaction_id", sa.String(length=36), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox_event")),
        sa.UniqueConstraint("event_id", name=op.f("uq_outbox_event_event_id")),
        sa.UniqueConstraint("merchant_id", "seq", name="uq_outbox_event_merchant_seq"),
    )
    with op.batch_alter_table("outbox_event", schema=None) as batch_op:
        batch_op.create_index(
            "ix_outbox_event_sent_at_id", ["sent_at", "id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("outbox_event", schema=None) as batch_op:
        batch_op.drop_index("ix_outbox_event_sent_at_id")

    op.drop_table("outbox_event")
    op.drop_table("merchant_outbox_seq")
