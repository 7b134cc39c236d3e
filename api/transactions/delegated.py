"""The create's two writes on Citus as delegated calls: one round trip each.

On Citus a batch of claims or finishes is one merchant's (one shard's) transaction, sent
from the API to the coordinator statement by statement — BEGIN, the lock timeout's
``SET LOCAL``s, the statements, COMMIT — each a round trip that Citus plans on the
coordinator and again on the merchant's worker (docs/scaling.md). Here the same writes are
one call each of a PL/pgSQL function distributed by its merchant argument and colocated
with ``idempotency_key`` (``create_distributed_function``): called outside a transaction
block, the coordinator hands the whole call to the worker holding the merchant's shard,
which runs it in one local transaction (its own commit, its own WAL flush) and answers.

- ``idempay_claim(m, claims)``: each row of ``claims`` (the rows ``store.claim_row``
  builds, in key order) inserted unless its key exists — ``INSERT … ON CONFLICT DO
  NOTHING``, as ``InsertIfAbsent`` — returning the positions of the rows that went in
  (comma-separated). Runs
  with ``lock_timeout`` 250 ms, as the claims' batches (``CLAIM_LOCK_TIMEOUT``).
- ``idempay_finish(m, finishes, rows)``: each finish completes its key if it still holds
  the lease (the ``UPDATE`` of ``store.complete``), then the transaction rows, ledger
  entries and outbox events of the finishes that did are inserted (the rows the finishes
  built, ``api.deferred``); returns the positions of the finishes that completed. Runs with
  ``lock_timeout`` 1 s, as the finishes' batches (``FINISH_LOCK_TIMEOUT``).

Nothing about the create's guarantees changes: the claim commits (on the worker) before its
0200 is sent; the finish's key update and its rows commit together or not at all; a call
whose answer is lost is judged as a batch's commit whose answer is lost (contract §2.2).
The lock timeouts are the functions' own settings, so they hold where the function runs:
on the merchant's worker when Citus delegates the call, which it does for a call outside a
transaction block — the only way the server calls them (an autocommit connection). Called
inside a transaction block, Citus runs the function on the coordinator and its statements
reach the worker without those timeouts: never call them so.
The functions are installed by ``idempay migrate`` on a Citus database (``install``, after
``api.migrate.distribute``); a server uses them only where they are installed
(``installed``), and writes its batches as transactions otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from api.idempotency.store import CLAIM_COLUMNS, COMPLETED, PROCESSING
from api.models import IdempotencyKey
from api.outbox.writer import EVENT_COLUMNS
from api.transactions.repository import LEDGER_COLUMNS, TRANSACTION_COLUMNS

CLAIM = "idempay_claim"
FINISH = "idempay_finish"
SIGNATURES = {CLAIM: f"{CLAIM}(text, jsonb)", FINISH: f"{FINISH}(text, jsonb, jsonb)"}
CLAIM_CALL = f"SELECT {CLAIM}($1, $2)"
FINISH_CALL = f"SELECT {FINISH}($1, $2, $3)"
# The finishes' rows: each table, its columns, and the column naming the row's key.
FINISH_TABLES: dict[str, tuple[tuple[str, ...], str]] = {
    "transaction": (TRANSACTION_COLUMNS, "id"),
    "ledger_entry": (LEDGER_COLUMNS, "transaction_id"),
    "outbox_event": (EVENT_COLUMNS, "transaction_id"),
}


def _quoted(name: str) -> str:
    return f'"{name}"'


def _insert(table: str, columns: Sequence[str], record: str) -> str:
    names = ", ".join(map(_quoted, columns))
    values = ", ".join(f"{record}.{_quoted(c)}" for c in columns)
    return f"INSERT INTO {_quoted(table)} ({names}) VALUES ({values})"


def claim_function() -> str:
    key_table = IdempotencyKey.__tablename__
    return f"""
CREATE OR REPLACE FUNCTION {CLAIM}(m text, claims jsonb) RETURNS text
LANGUAGE plpgsql SET lock_timeout = '250ms' AS $fn$
DECLARE
  r {_quoted(key_table)};
  won integer[] := '{{}}';
  written integer;
BEGIN
  FOR i IN 0 .. jsonb_array_length(claims) - 1 LOOP
    r := jsonb_populate_record(NULL::{_quoted(key_table)}, claims -> i);
    {_insert(key_table, CLAIM_COLUMNS, "r")} ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS written = ROW_COUNT;
    IF written > 0 THEN won := won || i; END IF;
  END LOOP;
  RETURN array_to_string(won, ',');
END $fn$
"""


def finish_function() -> str:
    key_table = IdempotencyKey.__tablename__
    inserts = []
    for n, (table, (columns, key_column)) in enumerate(FINISH_TABLES.items()):
        inserts.append(f"""
  FOR i IN 0 .. coalesce(jsonb_array_length(rows -> '{table}'), 0) - 1 LOOP
    r{n} := jsonb_populate_record(NULL::{_quoted(table)}, rows -> '{table}' -> i);
    IF r{n}.{_quoted(key_column)} = ANY(keys) THEN
      {_insert(table, columns, f"r{n}")};
    END IF;
  END LOOP;""")
    records = "\n".join(f"  r{n} {_quoted(t)};" for n, t in enumerate(FINISH_TABLES))
    return f"""
CREATE OR REPLACE FUNCTION {FINISH}(m text, finishes jsonb, rows jsonb) RETURNS text
LANGUAGE plpgsql SET lock_timeout = '1s' AS $fn$
DECLARE
  f jsonb;
  won integer[] := '{{}}';
  keys text[] := '{{}}';
  written integer;
{records}
BEGIN
  FOR i IN 0 .. jsonb_array_length(finishes) - 1 LOOP
    f := finishes -> i;
    UPDATE {_quoted(key_table)} SET state = '{COMPLETED}',
      response_status = (f ->> 'status')::integer, response_body = f ->> 'body',
      request = NULL, lease_until = NULL, updated_at = (f ->> 'at')::timestamptz
    WHERE merchant_id = m AND key = f ->> 'key' AND state = '{PROCESSING}'
      AND lease_token = (f ->> 'token')::integer;
    GET DIAGNOSTICS written = ROW_COUNT;
    IF written > 0 THEN
      won := won || i;
      keys := keys || (f ->> 'key');
    END IF;
  END LOOP;{"".join(inserts)}
  RETURN array_to_string(won, ',');
END $fn$
"""


def install(connection: Connection) -> None:
    """Create (or replace) both functions and distribute each by its merchant argument,
    colocated with ``idempotency_key`` (``idempay migrate`` on Citus, after the tables are
    distributed)."""
    for name, definition in ((CLAIM, claim_function()), (FINISH, finish_function())):
        connection.execute(text(definition))
        connection.execute(
            text("SELECT create_distributed_function(:f, 'm', colocate_with := :t)"),
            {"f": SIGNATURES[name], "t": IdempotencyKey.__tablename__},
        )


INSTALLED = (
    "SELECT count(*) FROM pg_dist_object o JOIN pg_proc p ON o.objid = p.oid"
    " WHERE o.classid = 'pg_proc'::regclass AND p.proname IN ('"
    + "', '".join(SIGNATURES)
    + "') AND o.distribution_argument_index IS NOT NULL"
)


def installed(connection: Connection) -> bool:
    """Both functions exist and are distributed (a server's start-up probe on Citus)."""
    return bool(connection.execute(text(INSTALLED)).scalar() == len(SIGNATURES))


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def dumps(value: Any) -> str:
    return json.dumps(value, default=_json_value, separators=(",", ":"))


async def call(conn: AsyncConnection, statement: str, *args: Any) -> list[int]:
    """One delegated call on an autocommit connection: the positions it returns (as text:
    an array result would cost asyncpg a type introspection per new connection, a query
    that took 1–2 s on a loaded Citus node)."""
    result = await conn.exec_driver_sql(statement, args)
    positions = result.scalar_one()
    return [int(n) for n in positions.split(",")] if positions else []
