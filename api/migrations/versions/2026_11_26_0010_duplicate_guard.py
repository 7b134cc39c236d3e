"""duplicate guard (issue 17, part 3): a merchant's window, the override flag, the index

- ``merchant.duplicate_guard_s`` (integer, nullable): the merchant's duplicate-guard window in
  seconds; NULL is off (the default for every merchant). ``idempay admin guard`` sets it.
- ``transaction.duplicate_override`` (boolean, not null, default false): true when the guard
  found a suspect and the cashier confirmed the sale (``"allow_duplicate": true``).
- ``ix_transaction_duplicate_guard`` on (merchant_id, terminal_id, card_fingerprint, amount,
  created_at): the guard's check is one range probe of it (currency, type and status are
  read from the few rows it finds).
- Postgres without Citus: ``idempay_duplicate_of(...)``, the guard's check as a function the
  one-write create statement calls (api/transactions/pg_create.py). It takes the guard's
  transaction-scoped advisory lock, then reads: a VOLATILE function's statements each take a
  fresh snapshot, so what a racing create committed while we waited for the lock is seen —
  one statement, one round trip, and the race of two new keys for the same sale is closed.
  Citus never runs the one-write statement (the general path writes there, one statement
  per shard), so it gets no function, like migration 0007's trigger.

On Citus the column additions and the index are ordinary DDL that Citus propagates to the
shards (``merchant`` is a reference table, ``transaction`` is distributed by merchant_id and
the index leads with it). Idempotent, as 0008/0009: each change is made only if it is
missing, so a half-applied run (SQLite has no transactional DDL for everything) finishes.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_transaction_duplicate_guard"
INDEX_COLUMNS = ["merchant_id", "terminal_id", "card_fingerprint", "amount", "created_at"]
# api.transactions.guard.LOCK_CLASS: the first key of pg_advisory_xact_lock(int4, int4).
LOCK_CLASS = 0x1DE4_0D0
FUNCTION = f"""
CREATE OR REPLACE FUNCTION idempay_duplicate_of(
    p_merchant varchar, p_terminal varchar, p_fingerprint varchar, p_amount bigint,
    p_currency varchar, p_since timestamptz, p_until timestamptz, p_key varchar,
    p_lock integer
) RETURNS varchar
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock({LOCK_CLASS}, p_lock);
    RETURN (
        SELECT id FROM "transaction"
        WHERE merchant_id = p_merchant AND terminal_id = p_terminal
          AND card_fingerprint = p_fingerprint AND amount = p_amount
          AND created_at >= p_since AND created_at <= p_until
          AND currency = p_currency AND type = 'purchase' AND status = 'approved'
          AND id <> p_key
        ORDER BY created_at DESC, id
        LIMIT 1
    );
END
$$
"""
DROP_FUNCTION = (
    "DROP FUNCTION IF EXISTS idempay_duplicate_of(varchar, varchar, varchar, bigint, varchar,"
    " timestamptz, timestamptz, varchar, integer)"
)


def _columns(table: str) -> set[str]:
    return {str(c["name"]) for c in sa.inspect(op.get_bind()).get_columns(table)}


def _indexes(table: str) -> set[str]:
    return {str(i["name"]) for i in sa.inspect(op.get_bind()).get_indexes(table)}


def _plain_postgres() -> bool:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return False
    citus = bind.exec_driver_sql("SELECT 1 FROM pg_extension WHERE extname = 'citus'")
    return citus.first() is None


def upgrade() -> None:
    if "duplicate_guard_s" not in _columns("merchant"):
        with op.batch_alter_table("merchant") as batch:
            batch.add_column(sa.Column("duplicate_guard_s", sa.Integer(), nullable=True))
    if "duplicate_override" not in _columns("transaction"):
        with op.batch_alter_table("transaction") as batch:
            batch.add_column(
                sa.Column(
                    "duplicate_override", sa.Boolean(), nullable=False, server_default=sa.false()
                )
            )
    if INDEX not in _indexes("transaction"):
        op.create_index(INDEX, "transaction", INDEX_COLUMNS, unique=False)
    if _plain_postgres():
        op.execute(FUNCTION)


def downgrade() -> None:
    if _plain_postgres():
        op.execute(DROP_FUNCTION)
    if INDEX in _indexes("transaction"):
        op.drop_index(INDEX, table_name="transaction")
    if "duplicate_override" in _columns("transaction"):
        with op.batch_alter_table("transaction") as batch:
            batch.drop_column("duplicate_override")
    if "duplicate_guard_s" in _columns("merchant"):
        with op.batch_alter_table("merchant") as batch:
            batch.drop_column("duplicate_guard_s")
