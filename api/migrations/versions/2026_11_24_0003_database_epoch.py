"""database epoch: the identity Redis entries are bound to (contract §3.6)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24 08:00:00
"""

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    table = op.create_table(
        "database_epoch",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.String(length=36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_database_epoch")),
    )
    now = datetime.now(UTC)
    if op.get_bind().dialect.name == "sqlite":  # stored naive, like api.db.UTCDateTime
        now = now.replace(tzinfo=None)
    op.bulk_insert(table, [{"id": 1, "epoch": str(uuid.uuid4()), "created_at": now}])


def downgrade() -> None:
    op.drop_table("database_epoch")
