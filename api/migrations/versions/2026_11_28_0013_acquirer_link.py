"""the acquirer link: the reversal-advice queue and the transaction's RRN

The acquirer is a remote host reached over ISO 8583 (contract §2.9). A 0200 left without an
answer is never resent: its key settles declined / acquirer_timeout and a 0420 reversal
advice is queued in the same transaction (``acquirer_advice``), repeated until a 0430. The
transaction records its retrieval reference (``rrn``, field 37), the lake's join key with the
acquirer's clearing file. On Citus ``acquirer_advice`` is distributed by ``merchant_id``,
colocated with the key rows (``api.migrate.distribute``).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28 23:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "acquirer_advice",
        sa.Column("merchant_id", sa.String(40), primary_key=True),
        sa.Column("key", sa.String(36), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("rrn", sa.String(12), nullable=False),
        sa.Column("terminal_id", sa.String(64), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("original_stan", sa.String(6), nullable=False),
        sa.Column("original_transmitted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.String(200), nullable=True),
        sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("merchant_id", "key", name=op.f("pk_acquirer_advice")),
    )
    op.create_index(
        "ix_acquirer_advice_pending", "acquirer_advice", ["acknowledged_at", "next_attempt_at"]
    )
    with op.batch_alter_table("transaction", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rrn", sa.String(12), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("transaction", schema=None) as batch_op:
        batch_op.drop_column("rrn")
    op.drop_index("ix_acquirer_advice_pending", table_name="acquirer_advice")
    op.drop_table("acquirer_advice")
