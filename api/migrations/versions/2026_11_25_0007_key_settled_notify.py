"""key settled → NOTIFY (issue 17, ``Prefer: wait``): Postgres tells the API workers when a
key leaves ``processing``, so a request waiting on it is answered at once, without polling.

A trigger on ``idempotency_key`` runs ``pg_notify('idempay_key_settled', '<merchant>:<key>')``
for rows whose state changes from processing to anything else, or whose lease is cut short
(a hand-over: a waiting duplicate may take the key over now). NOTIFY is delivered when the
transaction commits (never for one that rolls back). Only those updates fire: the one-write
create inserts a completed key directly and pays nothing, and a claim or take-over (the
lease lengthened) is silent. SQLite has no NOTIFY:
the embedded server wakes its waiters in process (``api.idempotency.waiters``).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 11:45:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FUNCTION = """
CREATE OR REPLACE FUNCTION idempay_key_settled() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idempay_key_settled', NEW.merchant_id || ':' || NEW.key);
    RETURN NULL;
END
$$
"""
TRIGGER = """
CREATE TRIGGER idempay_key_settled
AFTER UPDATE OF state, lease_until ON idempotency_key
FOR EACH ROW
WHEN (OLD.state = 'processing' AND (
    NEW.state <> 'processing' OR NEW.lease_until < OLD.lease_until
))
EXECUTE FUNCTION idempay_key_settled()
"""


def _plain_postgres() -> bool:
    """Postgres without Citus: on Citus the key rows live on the workers, whose NOTIFY
    never reaches a coordinator's listener — waiters there answer at their time limit."""
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return False
    citus = bind.exec_driver_sql("SELECT 1 FROM pg_extension WHERE extname = 'citus'")
    return citus.first() is None


def upgrade() -> None:
    if not _plain_postgres():
        return
    op.execute(FUNCTION)
    op.execute("DROP TRIGGER IF EXISTS idempay_key_settled ON idempotency_key")
    op.execute(TRIGGER)


def downgrade() -> None:
    if not _plain_postgres():
        return
    op.execute("DROP TRIGGER IF EXISTS idempay_key_settled ON idempotency_key")
    op.execute("DROP FUNCTION IF EXISTS idempay_key_settled()")
