"""webhooks: merchants' endpoints and the delivery queue with its dead letters (issue 17)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 09:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "webhook_endpoint",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("merchant_id", sa.String(length=40), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("enqueued_seq", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["merchant_id"], ["merchant.id"], name="fk_webhook_endpoint_merchant"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_endpoint")),
    )
    op.create_index(op.f("ix_webhook_endpoint_merchant_id"), "webhook_endpoint", ["merchant_id"])
    op.create_table(
        "webhook_delivery",
        sa.Column("endpoint_id", sa.String(length=40), nullable=False),
        sa.Column("event_id", sa.String(length=36), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("first_failed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.String(length=200), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("dead_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["endpoint_id"], ["webhook_endpoint.id"], name="fk_webhook_delivery_endpoint"
        ),
        sa.PrimaryKeyConstraint("endpoint_id", "event_id", name=op.f("pk_webhook_delivery")),
    )
    op.create_index(
        "ix_webhook_delivery_endpoint_id_seq", "webhook_delivery", ["endpoint_id", "seq"]
    )


def downgrade() -> None:
    op.drop_table("webhook_delivery")
    op.drop_index(op.f("ix_webhook_endpoint_merchant_id"), table_name="webhook_endpoint")
    op.drop_table("webhook_endpoint")
