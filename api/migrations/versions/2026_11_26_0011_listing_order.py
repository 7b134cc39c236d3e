"""listing order (review of issue 16, finding C): a per-row position that follows commit order

``GET /v1/transactions`` paged by (created_at, id), but created_at is the request's (the
claim's) time and the row commits later — a slow issuer's sale, a 202 finished by the
completer seconds afterwards — so a cursor already past its created_at skipped it for good.
The listing now pages by ``transaction.listing_pos`` (then created_at, id), a position that
no row committed later can fall below:

- ``transaction.listing_pos`` (bigint, nullable): rows that existed before this migration
  get 0 (they are all committed: they sort first, by created_at then id).
- Postgres without Citus: its default is the writing transaction's id,
  ``pg_current_xact_id()`` (64-bit, never wraps) — no insert names the column, so the
  one-write create is the same one statement. The listing returns only rows below the
  oldest transaction still running (``pg_snapshot_xmin(pg_current_snapshot())``): a row not
  yet committed always has a position at or above it, so it sorts after every row already
  returned (the outbox relay's standard approach).
- SQLite: writes are serialized (one writer at a time), so the merchant's highest position
  plus one, given at insert by a trigger, is commit order.
- Citus: the column only (NULL): the listing there keeps its (created_at, id) keyset — the
  coordinator evaluates an INSERT's volatile defaults while the rows and their snapshots
  are the workers', so a transaction id is not a commit-ordered position there yet
  (docs/contract.md §2.7).
- ``ix_transaction_listing`` on (merchant_id, listing_pos): the merchant's pages, and the
  trigger's MAX on SQLite, are range reads of it.

Idempotent, as 0008–0010: each change is made only if it is missing.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 23:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMN = "listing_pos"
INDEX = "ix_transaction_listing"
PG_DEFAULT = "(pg_current_xact_id()::text)::bigint"
TRIGGER = "transaction_listing_pos"
SQLITE_TRIGGER = f"""
CREATE TRIGGER IF NOT EXISTS {TRIGGER} AFTER INSERT ON "transaction"
WHEN NEW.{COLUMN} IS NULL
BEGIN
    UPDATE "transaction" SET {COLUMN} = (
        SELECT COALESCE(MAX({COLUMN}), 0) + 1 FROM "transaction"
        WHERE merchant_id = NEW.merchant_id
    )
    WHERE merchant_id = NEW.merchant_id AND id = NEW.id;
END
"""


def _columns(table: str) -> set[str]:
    return {str(c["name"]) for c in sa.inspect(op.get_bind()).get_columns(table)}


def _indexes(table: str) -> set[str]:
    return {str(i["name"]) for i in sa.inspect(op.get_bind()).get_indexes(table)}


def _citus() -> bool:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return False
    found = bind.exec_driver_sql("SELECT 1 FROM pg_extension WHERE extname = 'citus'")
    return found.first() is not None


def upgrade() -> None:
    bind = op.get_bind()
    if COLUMN not in _columns("transaction"):
        with op.batch_alter_table("transaction") as batch:
            batch.add_column(sa.Column(COLUMN, sa.BigInteger(), nullable=True))
    if bind.dialect.name == "sqlite":
        op.execute(f'UPDATE "transaction" SET {COLUMN} = 0 WHERE {COLUMN} IS NULL')
        op.execute(SQLITE_TRIGGER)
    elif not _citus():
        # The default first: a row inserted from here on has its position; then the rows
        # before it (this migration holds the table's lock until it commits).
        op.execute(f'ALTER TABLE "transaction" ALTER COLUMN {COLUMN} SET DEFAULT {PG_DEFAULT}')
        op.execute(f'UPDATE "transaction" SET {COLUMN} = 0 WHERE {COLUMN} IS NULL')
    if INDEX not in _indexes("transaction"):
        op.create_index(INDEX, "transaction", ["merchant_id", COLUMN], unique=False)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        op.execute(f"DROP TRIGGER IF EXISTS {TRIGGER}")
    if INDEX in _indexes("transaction"):
        op.drop_index(INDEX, table_name="transaction")
    if COLUMN in _columns("transaction"):
        with op.batch_alter_table("transaction") as batch:
            batch.drop_column(COLUMN)
