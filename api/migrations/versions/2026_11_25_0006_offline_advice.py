"""offline advices (issue 16): transaction.offline, and the index of the terminal listing

A terminal that sold offline forwards the payment later as an advice
(``"entry_mode": "offline"``); the transaction records that it was one. The listing
``GET /v1/transactions?terminal_id=…&since=…`` pages by (created_at, id) within a merchant
and terminal.

Revision ID: 0006
Revises: 0004
Create Date: 2026-11-25 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_transaction_merchant_id_terminal_id_created_at"


def upgrade() -> None:
    with op.batch_alter_table("transaction", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("offline", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.create_index(
        INDEX, "transaction", ["merchant_id", "terminal_id", "created_at", "id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(INDEX, table_name="transaction")
    with op.batch_alter_table("transaction", schema=None) as batch_op:
        batch_op.drop_column("offline")
