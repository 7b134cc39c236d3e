"""``Prefer: wait=N`` (RFC 7240; contract §2, issue 17): a create, lookup or abort that
finds its key in flight may hold the request until the key settles instead of answering
409/202 at once and making the terminal poll.

One ``Waiters`` per worker process: a table of (merchant, key) → the events of the requests
waiting on it, bounded by ``limit`` (a request that finds the table full is answered at
once, as without the preference — never a 503). Nothing polls per waiter:

- Postgres: a trigger (migration 0007) runs ``pg_notify('idempay_key_settled',
  '<merchant>:<key>')`` when a key leaves ``processing``; NOTIFY is delivered only when
  that transaction commits, so a woken waiter always reads the settled row. Each worker
  keeps one LISTEN connection (``run_forever``); when it drops, every waiter is woken to
  look again (a notification may have been missed) and the connection is re-made.
- SQLite (the embedded default, one process): the keys a transaction settled wake their
  waiters after its commit (``settled_here``, registered with ``api.db.after_commit``).

A woken waiter looks the key up again; if it is still in flight it waits for the rest of
its time. Whatever happens, the request is answered as it would have been, at the latest
when its ``N`` seconds are over.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import structlog

from api.db import after_commit
from api.headers import parse_capped_seconds

log = structlog.get_logger("idempay.waiters")
CHANNEL = "idempay_key_settled"
PING_EVERY_S = 15.0  # the LISTEN connection is checked this often
PING_TIMEOUT_S = 5.0
_OWS = " \t"  # HTTP's optional whitespace (RFC 9110 §5.6.3); str.strip() would also eat NBSP


def _preferences(values: list[str]) -> Iterator[tuple[str, str]]:
    """(name, value) of each preference in ``Prefer`` field values (RFC 7240 §2: several
    fields are one comma-separated list; a preference's ``;`` parameters are not
    preferences; quoted strings may hold commas and semicolons)."""
    for field in values:
        token: list[str] = []
        quoted = False
        for char in field + ",":
            if char == '"':
                quoted = not quoted
            if char == "," and not quoted:
                head = "".join(token).split(";", 1)[0].strip(_OWS)
                name, _, value = head.partition("=")
                yield name.strip(_OWS).lower(), value.strip(_OWS).strip('"')
                token = []
            else:
                token.append(char)


def preferred_wait(prefer: str | list[str] | None, cap: float) -> int:
    """Seconds asked for by ``Prefer: wait=N`` (RFC 7240 §4.3), capped at ``cap``; 0 when
    absent, negative or malformed — anything but ASCII digits (a preference the server does
    not understand is ignored; contract §2.8)."""
    if not prefer:
        return 0
    for name, value in _preferences([prefer] if isinstance(prefer, str) else prefer):
        if name == "wait":
            seconds = parse_capped_seconds(value, cap=int(cap))
            if seconds is not None:
                return seconds
    return 0


SETTLED_KEYS = "idempay_settled_keys"  # Connection.info: keys settled in its transaction
_HERE: weakref.WeakSet[Waiters] = weakref.WeakSet()  # this process's tables


def settled_here(merchant_id: str, key: str) -> None:
    """A key settled by a transaction of this process has committed: wake its waiters."""
    for waiters in list(_HERE):
        waiters.notify(merchant_id, key)


def _settled(keys: Sequence[tuple[str, str]]) -> None:
    for merchant_id, key in keys:
        settled_here(merchant_id, key)


after_commit(SETTLED_KEYS, _settled)  # the keys ``store`` settled, once their commit is done


class WaitersFull(Exception):
    """Every waiting slot of this worker is taken: answer at once, as without ``Prefer``."""


class Waiters:
    def __init__(
        self,
        *,
        limit: int,
        listen_dsn: dict[str, Any] | None = None,
        recheck_s: float | None = None,
        look_slots: int = 8,
    ) -> None:
        self._waiting: dict[tuple[str, str], set[asyncio.Event]] = {}
        self._count = 0
        self.limit = limit
        self.look_slots = max(1, look_slots)
        self._looks = asyncio.Semaphore(self.look_slots)
        self._connect_args = listen_dsn
        self.recheck_s = recheck_s  # a look at least this often (SQLite: other processes)
        self.closing = False
        self.listening = asyncio.Event()  # the LISTEN connection is up (Postgres)
        # Set near the end of SIGTERM's grace (api/main.py): a create still waiting on
        # storage or the issuer is answered in flight then (waiting.before_exit).
        self.exit_passed = asyncio.Event()
        self.orphans: set[asyncio.Task[Any]] = set()  # creates answered before they ended
        _HERE.add(self)

    @property
    def count(self) -> int:
        return self._count

    @contextlib.contextmanager
    def watch(self, merchant_id: str, key: str) -> Iterator[asyncio.Event]:
        """An event set when (merchant, key) may have settled. Register *before* looking the
        key up again, so that a settlement between the look and the wait is not missed."""
        if self._count >= self.limit or self.closing:
            raise WaitersFull
        event = asyncio.Event()
        slot = (merchant_id, key)
        self._waiting.setdefault(slot, set()).add(event)
        self._count += 1
        try:
            yield event
        finally:
            self._count -= 1
            events = self._waiting.get(slot)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiting[slot]

    @contextlib.asynccontextmanager
    async def look_slot(self, within: float) -> AsyncIterator[bool]:
        """A slot for a woken waiter's look, waited for at most ``within`` seconds; yields
        whether one was had. Bounds the looks of a herd woken at once to a share of the
        connection pool: they queue here, not on the pool (whose timeout answers 503)."""
        try:
            await asyncio.wait_for(self._looks.acquire(), max(within, 0.0))
        except TimeoutError:
            yield False
            return
        try:
            yield True
        finally:
            self._looks.release()

    def notify(self, merchant_id: str, key: str) -> None:
        for event in self._waiting.get((merchant_id, key), ()):
            event.set()

    def notify_all(self) -> None:
        for events in self._waiting.values():
            for event in events:
                event.set()

    def pass_exit(self) -> None:
        self.exit_passed.set()

    def close(self) -> None:
        """The worker is shutting down (SIGTERM): every waiter answers now, with its last
        look, instead of holding the graceful shutdown until its time limit."""
        self.closing = True
        self.notify_all()

    def _on_notification(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        merchant_id, _, key = payload.partition(":")
        self.notify(merchant_id, key)

    async def run_forever(self, *, retry_s: float = 1.0) -> None:
        """Postgres: hold one LISTEN connection, re-made when it drops. No-op otherwise."""
        if self._connect_args is None:
            return
        import asyncpg

        while True:
            lost = asyncio.Event()
            conn = None
            try:
                conn = await asyncpg.connect(**self._connect_args)
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(CHANNEL, self._on_notification)
                self.listening.set()
                self.notify_all()  # anything settled while we were not listening
                while not lost.is_set():  # a silent network cut closes nothing: ping
                    try:
                        await asyncio.wait_for(lost.wait(), PING_EVERY_S)
                    except TimeoutError:
                        await asyncio.wait_for(conn.fetchval("SELECT 1"), PING_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # storage down: waiters time out and answer as usual
                log.warning("waiters_listen_failed", error=type(exc).__name__)
            finally:
                self.listening.clear()  # waiters are woken once LISTEN is back (above), not
                # now: a look into a database that just went away would answer 503
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.close(), 2)
            await asyncio.sleep(retry_s)


def listen_args(database_url: str) -> dict[str, Any] | None:
    """asyncpg connect arguments for the LISTEN connection; None for SQLite."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    if not url.drivername.startswith("postgresql"):
        return None
    from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg

    _args, connect_args = PGDialect_asyncpg().create_connect_args(url)  # type: ignore[no-untyped-call]
    for name in ("async_creator_fn", "prepared_statement_name_func"):
        connect_args.pop(name, None)
    connect_args.pop("prepared_statement_cache_size", None)
    return dict(connect_args)
