"""merchant keys: ``merchant_id`` in every primary key and unique constraint (issue 18)

Citus distributes a table by a column only if each of its primary keys and unique
constraints contains that column, and idempay's tables are sharded by merchant
(docs/scaling.md). Four tables did not qualify:

| table                  | before                               | after                                       |
|------------------------|--------------------------------------|---------------------------------------------|
| ledger_entry           | pk (entry_id)                        | pk (merchant_id, entry_id)                  |
| request_event          | pk (event_id)                        | pk (merchant_id, event_id)                  |
| outbox_event           | pk (id), unique (event_id)           | pk (merchant_id, id), unique (merchant_id, event_id) |
| issuer_authorization   | pk (issuer_key), no merchant_id      | + merchant_id, pk (merchant_id, issuer_key) |

Every id involved is already unique on its own (UUIDs, a sequence, an HMAC of the merchant and
the key), so no row can violate the new keys and no lookup changes meaning.

- ``request_event`` keeps a unique constraint on ``event_id`` alone on Postgres and SQLite:
  the event writer's ``ON CONFLICT (event_id) DO NOTHING`` names it (api/events/writer.py).
  A Citus table cannot have it; ``api.migrate.distribute`` drops it there, and the writer
  must name (merchant_id, event_id) as its conflict target to run on Citus.

- ``issuer_authorization.merchant_id`` defaults to ``''`` for writers that do not name it yet;
  the rows already stored get their merchant back: the issuer key is
  ``HMAC(IDEMPAY_SECRET_KEY, "<merchant>:<key>")``, so each key row names its record (rows
  whose key row is gone — a purged tombstone's void — keep ``''``).
- SQLite keeps ``outbox_event.id`` as its single-column primary key: only an ``INTEGER
  PRIMARY KEY`` column numbers itself there (the relay orders by it), and SQLite is never
  distributed. Its event-id uniqueness moves to (merchant_id, event_id) as on Postgres.
- Idempotent: each change is made only if the table does not have it yet, so a database
  changed by hand (or half-way, on a backend without transactional DDL) finishes cleanly.

Distribution itself is not a migration step: ``idempay migrate`` distributes the tables after
the migrations when the database has the citus extension (``api.migrate.distribute``).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 12:00:00
"""

import hashlib
import hmac
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BACKFILL_CHUNK = 5_000
NEW_KEYS = {
    "ledger_entry": ["merchant_id", "entry_id"],
    "request_event": ["merchant_id", "event_id"],
    "issuer_authorization": ["merchant_id", "issuer_key"],
    "outbox_event": ["merchant_id", "id"],  # Postgres only (see above)
}
OLD_KEYS = {
    "ledger_entry": ["entry_id"],
    "request_event": ["event_id"],
    "issuer_authorization": ["issuer_key"],
    "outbox_event": ["id"],
}
EVENT_ID_UNIQUE = ("uq_outbox_event_event_id", ["event_id"])
REQUEST_EVENT_ID_UNIQUE = "uq_request_event_event_id"
MERCHANT_EVENT_ID_UNIQUE = ("uq_outbox_event_merchant_event_id", ["merchant_id", "event_id"])


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def _primary_key(table: str) -> list[str]:
    return list(sa.inspect(op.get_bind()).get_pk_constraint(table)["constrained_columns"])


def _uniques(table: str) -> dict[str, list[str]]:
    found = sa.inspect(op.get_bind()).get_unique_constraints(table)
    return {str(u["name"]): list(u["column_names"]) for u in found}


def _columns(table: str) -> set[str]:
    return {str(c["name"]) for c in sa.inspect(op.get_bind()).get_columns(table)}


def _set_primary_key(table: str, columns: list[str]) -> None:
    if _primary_key(table) == columns:
        return
    with op.batch_alter_table(table, recreate="auto") as batch:
        batch.drop_constraint(f"pk_{table}", type_="primary")
        batch.create_primary_key(f"pk_{table}", columns)


def _set_outbox_event_id_unique(new: tuple[str, list[str]], old: tuple[str, list[str]]) -> None:
    uniques = _uniques("outbox_event")
    if uniques.get(new[0]) == new[1] and old[0] not in uniques:
        return
    with op.batch_alter_table("outbox_event") as batch:
        if old[0] in uniques:
            batch.drop_constraint(old[0], type_="unique")
        if new[0] not in uniques:
            batch.create_unique_constraint(new[0], new[1])


def _issuer_key(secret: str, merchant_id: str, key: str) -> str:
    """``api.transactions.issuer.derive_issuer_key`` as of this revision (frozen here)."""
    message = f"{merchant_id}:{key}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()[:40]


def _backfill_issuer_merchants() -> None:
    """Name the merchant of every stored issuer record whose key row still exists."""
    bind = op.get_bind()
    if not bind.execute(
        sa.text("SELECT 1 FROM issuer_authorization WHERE merchant_id = '' LIMIT 1")
    ).first():
        return
    from api.config import Settings  # the secret the servers derive issuer keys with

    secret = Settings().secret_key
    update = sa.text(
        "UPDATE issuer_authorization SET merchant_id = :merchant_id "
        "WHERE merchant_id = '' AND issuer_key = :issuer_key"
    )
    # A keyset on the primary key: each chunk is one range scan of pk_idempotency_key from
    # the last (merchant_id, key) seen. (Until the 2026-11-26 review the condition was
    # ``merchant_id > :m OR (merchant_id = :m AND key > :k)``, which Postgres cannot turn into
    # an index range: every chunk filtered the index from its start — quadratic, ~150 ms a
    # chunk at 150k keys. Same rows, same order: the result is unchanged.)
    last: tuple[str, str] = ("", "")
    if bind.dialect.name == "postgresql":
        # The new column has no statistics yet: the planner would hash-join each chunk's
        # 5,000 pairs against a full scan of issuer_authorization (quadratic again: 865 ms a
        # chunk at 1M records, against 95 ms with the nested loop of primary-key probes).
        # Set for this transaction and reset below, so nothing after the backfill plans so.
        bind.exec_driver_sql("SET LOCAL enable_hashjoin = off")
        bind.exec_driver_sql("SET LOCAL enable_mergejoin = off")
    try:
        _walk(bind, secret, update, last)
    finally:
        if bind.dialect.name == "postgresql":
            bind.exec_driver_sql("RESET enable_hashjoin")
            bind.exec_driver_sql("RESET enable_mergejoin")


def _walk(bind: sa.Connection, secret: str, update: sa.TextClause, last: tuple[str, str]) -> None:
    while True:
        rows = bind.execute(
            sa.text(
                "SELECT merchant_id, key FROM idempotency_key "
                "WHERE (merchant_id, key) > (:m, :k) "
                "ORDER BY merchant_id, key LIMIT :n"
            ),
            {"m": last[0], "k": last[1], "n": BACKFILL_CHUNK},
        ).all()
        if not rows:
            return
        pairs = [{"merchant_id": m, "issuer_key": _issuer_key(secret, m, k)} for m, k in rows]
        if bind.dialect.name == "postgresql":
            bind.execute(*_update_from_values(pairs))  # one statement a chunk, index probes
        else:
            bind.execute(update, pairs)  # SQLite: in-process, a statement is cheap
        last = (rows[-1][0], rows[-1][1])


def _update_from_values(pairs: list[dict[str, str]]) -> tuple[sa.TextClause, dict[str, Any]]:
    """One ``UPDATE … FROM unnest(…)`` for a chunk: the same rows as one UPDATE per pair
    (merchant_id = '' and the issuer key), in one round trip and one plan (Postgres)."""
    statement = sa.text(
        "UPDATE issuer_authorization AS ia SET merchant_id = v.merchant_id "
        "FROM unnest(CAST(:ms AS varchar[]), CAST(:ks AS varchar[]))"
        " AS v (merchant_id, issuer_key) "
        "WHERE ia.merchant_id = '' AND ia.issuer_key = v.issuer_key"
    )
    params = {
        "ms": [p["merchant_id"] for p in pairs],
        "ks": [p["issuer_key"] for p in pairs],
    }
    return statement, params


def upgrade() -> None:
    if "merchant_id" not in _columns("issuer_authorization"):
        with op.batch_alter_table("issuer_authorization") as batch:
            batch.add_column(
                sa.Column("merchant_id", sa.String(length=40), nullable=False, server_default="")
            )
    _backfill_issuer_merchants()
    for table, columns in NEW_KEYS.items():
        if table == "outbox_event" and _sqlite():
            continue
        _set_primary_key(table, columns)
    _set_outbox_event_id_unique(MERCHANT_EVENT_ID_UNIQUE, EVENT_ID_UNIQUE)
    if REQUEST_EVENT_ID_UNIQUE not in _uniques("request_event"):
        with op.batch_alter_table("request_event") as batch:
            batch.create_unique_constraint(REQUEST_EVENT_ID_UNIQUE, ["event_id"])


def downgrade() -> None:
    if REQUEST_EVENT_ID_UNIQUE in _uniques("request_event"):
        with op.batch_alter_table("request_event") as batch:
            batch.drop_constraint(REQUEST_EVENT_ID_UNIQUE, type_="unique")
    _set_outbox_event_id_unique(EVENT_ID_UNIQUE, MERCHANT_EVENT_ID_UNIQUE)
    for table, columns in OLD_KEYS.items():
        if table == "outbox_event" and _sqlite():
            continue
        _set_primary_key(table, columns)
    if "merchant_id" in _columns("issuer_authorization"):
        with op.batch_alter_table("issuer_authorization") as batch:
            batch.drop_column("merchant_id")
