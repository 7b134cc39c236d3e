"""the in-process issuer leaves: drop ``issuer_authorization``

Every create crosses the acquirer link (claim, one 0200, finish; contract §2.9): the
authorization is the acquirer host's record, kept in its own store, and the server no longer
reads or writes an issuer record of its own. The table goes. On Citus it was distributed by
``merchant_id`` (``api.migrate.DISTRIBUTED``): a plain ``DROP TABLE`` on the coordinator drops
its shards too, so the statement is the same on SQLite, Postgres and Citus. Its rows are not
kept: they recorded the old simulator's answers, which the transactions already hold.

The downgrade creates the table again, empty, in its 0012 shape (key ``(merchant_id,
issuer_key)``); on Citus it stays a local table on the coordinator (0013's code reads none).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28 23:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_table("issuer_authorization")


def downgrade() -> None:
    op.create_table(
        "issuer_authorization",
        sa.Column("merchant_id", sa.String(length=40), nullable=False, server_default=""),
        sa.Column("issuer_key", sa.String(length=64), nullable=False),
        sa.Column("result", sa.String(length=16), nullable=False),
        sa.Column("decline_reason", sa.String(length=64), nullable=True),
        sa.Column("authorization_code", sa.String(length=16), nullable=True),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("calls", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("voided_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint(
            "merchant_id", "issuer_key", name=op.f("pk_issuer_authorization")
        ),
    )
