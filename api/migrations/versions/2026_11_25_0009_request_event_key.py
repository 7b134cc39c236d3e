"""request_event: the event_id-only unique constraint goes on Citus only (issue 18)

Migration 0008 kept ``uq_request_event_event_id`` because the event writer named ``event_id``
as its conflict target; the writer names the table's key, (merchant_id, event_id), since
3f04565, as Citus requires (event ids are uuid4, so a retried batch conflicts the same way).

- **Citus**: the constraint goes — a distributed table's unique constraints must contain
  the distribution column, and ``idempay migrate`` distributes the tables right after.
- **Plain Postgres and SQLite**: it stays through this release (expand/contract, reviewed
  2026-11-26). A replica older than 3f04565 still serving during the rolling update flushes
  with ``ON CONFLICT (event_id)``, which needs a unique constraint on exactly that column:
  with it dropped every flush failed and its request events were lost (the review saw 119
  of 134 unwritten). The drop is the contract step of a later release, once no replica
  older than 3f04565 can serve (docs/operations.md, "Releases and migrations").

Databases that ran the first version of this revision (which dropped it everywhere) keep
their state: the constraint is not recreated (see docs/operations.md for why, and for what a
rollback to code older than 3f04565 must do first). Idempotent.

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


def _citus() -> bool:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return False
    found = bind.exec_driver_sql("SELECT 1 FROM pg_extension WHERE extname = 'citus'")
    return found.first() is not None


def upgrade() -> None:
    if _citus() and _has_it():
        with op.batch_alter_table("request_event") as batch:
            batch.drop_constraint(CONSTRAINT, type_="unique")


def downgrade() -> None:
    if not _has_it():
        with op.batch_alter_table("request_event") as batch:
            batch.create_unique_constraint(CONSTRAINT, ["event_id"])
