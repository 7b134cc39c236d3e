"""request_event: the event_id-only unique constraint goes (issue 18)

Migration 0008 kept ``uq_request_event_event_id`` because the event writer named ``event_id``
as its conflict target; the writer now names the table's key, (merchant_id, event_id), as
Citus requires (event ids are uuid4, so a retried batch conflicts the same way). One index
less per event written. Idempotent.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 14:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CONSTRAINT = "uq_request_event_event_id"


def _has_it() -> bool:
    uniques = sa.inspect(op.get_bind()).get_unique_constraints("request_event")
    return any(u["name"] == CONSTRAINT for u in uniques)


def upgrade() -> None:
    if _has_it():
        with op.batch_alter_table("request_event") as batch:
            batch.drop_constraint(CONSTRAINT, type_="unique")


def downgrade() -> None:
    if not _has_it():
        with op.batch_alter_table("request_event") as batch:
            batch.create_unique_constraint(CONSTRAINT, ["event_id"])
