"""The hot path's key reads on Postgres: one prepared ``SELECT`` per read.

An asyncpg prepared statement, run on a connection of the hot path's own pool
(``api.db.DriverPool``: three quarters of ``IDEMPAY_DB_POOL_SIZE``, the engine keeps the
rest — one budget; no SQLAlchemy checkout and check-in per request), in autocommit: no
BEGIN/ROLLBACK. Replay, lookup, abort and reversal read the key row (and its transaction)
here (``api.transactions.inline``). The same statements run on plain Postgres and Citus:
each names the merchant, so Citus routes it to the merchant's shard.

Errors (``run``): a pool that cannot give a connection in ``IDEMPAY_DB_TIMEOUT`` (or open
one) and a statement failing for want of storage (``api.storage_errors.storage_unavailable``)
raise ``StorageUnavailableError`` (503, nothing processed); the connection of the latter is
closed and the idle ones retired. Any other statement error is a bug (500) and leaves the
connection usable; a statement cut short (cancelled) closes its connection. A read past
``command_timeout`` is 503 (``StatementTimedOut``), once the server has ended it.
"""

from __future__ import annotations

from typing import Any

from api.db import DriverPool
from api.idempotency.store import KeyRecord
from api.storage_errors import StorageUnavailableError, storage_unavailable
from api.transactions.inline import (
    KEY_WIDTH,
    READ_KEY_AND_TRANSACTION,
    TRANSACTION_COLUMNS,
    StoredTransaction,
)

READ_KEY = """
SELECT merchant_id, key, state, fingerprint, lease_token, lease_until, request,
  response_status, response_body, terminal_id, created_at, deadline_at
FROM idempotency_key WHERE merchant_id = $1 AND key = $2
"""

READ_WITH_TRANSACTION = READ_KEY_AND_TRANSACTION.format(merchant="$1", key="$2")

READ_TRANSACTION = (
    f'SELECT {TRANSACTION_COLUMNS} FROM "transaction" WHERE merchant_id = $1 AND id = $2'
)


class PgInline:
    """The key reads on the hot path's pool (``api.main.hot_reads``)."""

    def __init__(self, pool: DriverPool) -> None:
        self.pool = pool

    async def _call(self, method: str, statement: str, *args: Any) -> Any:
        """One statement (``run``): past ``command_timeout`` ``StatementTimedOut``, a 503
        (a read processed nothing)."""
        return await run(self.pool, method, statement, *args)

    async def read(self, merchant_id: str, key: str) -> KeyRecord | None:
        row = await self._call("fetchrow", READ_KEY, merchant_id, key)
        return KeyRecord(*row) if row is not None else None

    async def read_transaction(self, merchant_id: str, key: str) -> StoredTransaction | None:
        row = await self._call("fetchrow", READ_TRANSACTION, merchant_id, key)
        return StoredTransaction(*row) if row is not None else None

    async def read_with_transaction(
        self, merchant_id: str, key: str
    ) -> tuple[KeyRecord | None, StoredTransaction | None]:
        row = await self._call("fetchrow", READ_WITH_TRANSACTION, merchant_id, key)
        if row is None:
            return None, None
        record = KeyRecord(*row[:KEY_WIDTH])
        txn = StoredTransaction(*row[KEY_WIDTH:]) if row[KEY_WIDTH] is not None else None
        return record, txn

    async def close(self) -> None:
        """Close the pool's connections (the app's shutdown, after the last request)."""
        await self.pool.close()


class StatementTimedOut(StorageUnavailableError):
    """The statement ran past the connection's ``command_timeout``: 503 (a read processes
    nothing). ``ended``: asyncpg's cancel was acknowledged by the server (its ReadyForQuery)
    and the connection went back to the pool; else it was closed."""

    def __init__(self, *, ended: bool) -> None:
        super().__init__("statement timed out" + ("; ended" if ended else "; end unconfirmed"))
        self.ended = ended


async def run(pool: DriverPool, method: str, statement: str, *args: Any) -> Any:
    """One statement on a connection of ``pool`` (``conn.<method>``, autocommit): the one
    place the hot path takes, gives back and closes connections. No connection in the pool's
    ``timeout`` (or none can be opened), or a statement failing for want of storage: raises
    ``StorageUnavailableError`` (503) and closes the connection, retiring the idle ones — a
    restart or a failover left them all dead. Another statement error (a bug) is raised as
    it is and the connection goes back. Past ``command_timeout``: ``StatementTimedOut``,
    once the server has acknowledged asyncpg's cancel (or that could not be confirmed within
    the pool's ``timeout``: the connection is closed)."""
    try:
        conn = await pool.acquire()
    except Exception as exc:  # no connection in time, connect refused, pool closed
        raise StorageUnavailableError(type(exc).__name__) from exc
    try:
        result = await getattr(conn, method)(statement, *args)
    except TimeoutError:  # command_timeout: asyncpg has only scheduled the server's cancel
        ended = await _settle(pool, conn)
        raise StatementTimedOut(ended=ended) from None
    except Exception as exc:
        if not storage_unavailable(exc):
            pool.release(conn)  # a statement error: rolled back, the connection is fine
            raise
        pool.discard(conn, outage=True)  # never hand a broken connection out again
        raise StorageUnavailableError(type(exc).__name__) from exc
    except BaseException:
        pool.discard(conn, outage=False)  # cut short mid-statement: not reusable
        raise
    pool.release(conn)
    return result


async def _settle(pool: DriverPool, conn: Any) -> bool:
    """After a ``command_timeout``: True once the server has ended the statement. asyncpg
    runs the next query on this connection only after its cancel was sent and the server
    answered the cancelled statement (ReadyForQuery: its transaction committed or rolled
    back, nothing of it left running); it closes the connection itself if that does not
    come within the timeout. Meant to hold behind PgBouncer too (not measured here): the
    cancel is the protocol's, which PgBouncer routes to the server connection running the
    statement, and no backend pid is used."""
    try:
        await conn.fetchval("SELECT 1", timeout=pool.timeout)
    except Exception:  # unconfirmed (asyncpg closed it)
        pool.discard(conn, outage=True)
        return False
    except BaseException:  # cancelled while waiting
        pool.discard(conn, outage=False)
        raise
    pool.release(conn)
    return True
