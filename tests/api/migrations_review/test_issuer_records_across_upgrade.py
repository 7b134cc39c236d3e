"""Review finding 1 (issue 18, migrations 0008/0012): issuer records across the upgrade.

Code before 7c2ea99 (the shipped a038ec9 among it) wrote ``issuer_authorization.merchant_id =
''`` even after migration 0008 had run; the current code looks its record up by (merchant,
issuer key). A key in flight across the upgrade, whose issuer record an old replica wrote:

(a) fenced past its issuer deadline: the void wrote a fresh ``voided`` row under the merchant
    and left the old ``approved`` one standing — an authorization never voided;
(b) re-driven (a long ``IDEMPAY_ISSUER_DEADLINE``): a second ``approved`` row for the same
    issuer key — the issuer authorized twice.

Each test migrates a fresh database to the revision before 0012, writes the key and its
issuer record as the old code did (``merchant_id = ''``), upgrades to head (or, for the
``after`` case, writes the old record once the database is at head: an old replica still
serving during the rolling update), then drives the completer, on Postgres and SQLite.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import event

from api.config import Settings
from api.db import atomic, create_engine, utcnow
from api.idempotency import store
from api.idempotency.completer import Completer
from api.idempotency.keys import body_fingerprint
from api.migrate import alembic_config, migrate
from api.transactions.issuer import SimulatedIssuer, derive_issuer_key
from api.transactions.recovery import Recovered
from api.transactions.schemas import TransactionCreate
from api.transactions.service import TransactionService
from tests.support.backend import Backend
from tests.support.client import body, card
from tests.support.services import create_database, drop_database, pg_url

pytestmark = pytest.mark.server

SECRET = Settings.model_fields["secret_key"].default
MERCHANT = "mer_review_m4"
T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


def before_0012(settings: Settings) -> str:
    script = ScriptDirectory.from_config(alembic_config(settings))
    down = script.get_revision("0012").down_revision
    assert isinstance(down, str)
    return down


@pytest.fixture(params=["postgres", "sqlite"])
def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    name = create_database("mig_review") if request.param == "postgres" else None
    try:
        backend = Backend(request.param, pg_url(name) if name else None, tmp_path)
        backend.settings.var_dir.mkdir(parents=True, exist_ok=True)
        command.upgrade(alembic_config(backend.settings), before_0012(backend.settings))
        yield backend
    finally:
        if name:
            drop_database(name)


def settings_for(backend: Backend, *, deadline: float) -> Settings:
    return Settings(
        database_url=backend.database_url,
        var_dir=backend.tmp / "var",
        db_pool_size=2,
        issuer_slow_seconds=0.0,
        issuer_timeout=0.3,
        lease_seconds=30.0,
        issuer_deadline=deadline,
        redis_url=None,
    )


def in_flight_key(backend: Backend, *, deadline: float) -> str:
    """A tok_issuer_timeout key claimed 2 minutes ago whose owner is gone (its lease ran out),
    as the old code left it: ``processing``, the first issuer call recorded but unanswered."""
    key = str(uuid.uuid4())
    payment = TransactionCreate.model_validate(body(card=card("tok_issuer_timeout")))

    async def claim() -> None:
        settings = settings_for(backend, deadline=deadline)
        engine = create_engine(settings)
        try:
            async with atomic(engine) as conn:
                assert await store.claim(
                    conn,
                    merchant_id=MERCHANT,
                    key=key,
                    fingerprint=body_fingerprint(payment),
                    request=payment.stored_request(),
                    terminal_id=payment.terminal_id,
                    now=utcnow() - timedelta(minutes=2),
                    lease_s=1.0,
                    deadline_s=deadline,
                )
        finally:
            await engine.dispose()

    asyncio.run(claim())
    return key


def old_issuer_record(backend: Backend, key: str, *, merchant_id: str = "", **row: Any) -> None:
    """What SimulatedIssuer._record before 7c2ea99 wrote: no merchant (the column's '')."""
    values = {
        "m": merchant_id,
        "k": derive_issuer_key(SECRET, MERCHANT, key),
        "result": "approved",
        "code": "0797C6",
        "calls": 1,
        "voided_at": None,
        **row,
    }
    backend.sql(
        "INSERT INTO issuer_authorization (merchant_id, issuer_key, result, authorization_code,"
        " amount, currency, calls, created_at, voided_at) VALUES (:m, :k, :result, :code, 1990,"
        " 'BRL', :calls, :t, :voided_at)",
        t=utcnow() - timedelta(minutes=2),
        **values,
    )


def drive(backend: Backend, *, deadline: float) -> Completer:
    async def run() -> Completer:
        settings = settings_for(backend, deadline=deadline)
        engine = create_engine(settings)
        try:
            service = TransactionService(engine, SimulatedIssuer(engine, slow_seconds=0), settings)
            completer = Completer(service, interval=0.05, slots=4)
            assert await completer.run_once() == 1
            return completer
        finally:
            await engine.dispose()

    return asyncio.run(run())


def issuer_rows(backend: Backend, key: str) -> list[tuple[str, str, int]]:
    rows = backend.sql(
        "SELECT merchant_id, result, calls FROM issuer_authorization WHERE issuer_key = :k"
        " ORDER BY merchant_id",
        k=derive_issuer_key(SECRET, MERCHANT, key),
    )
    return [(str(m), str(r), int(c)) for m, r, c in rows]


def count(backend: Backend, table: str, key: str, extra: str = "") -> int:
    column = "transaction_id" if table == "ledger_entry" else "id"
    rows = backend.sql(
        f'SELECT count(*) FROM "{table}" WHERE merchant_id = :m AND {column} = :k {extra}',
        m=MERCHANT,
        k=key,
    )
    return int(rows[0][0])


def state(backend: Backend, key: str) -> str:
    rows = backend.sql(
        "SELECT state FROM idempotency_key WHERE merchant_id = :m AND key = :k", m=MERCHANT, k=key
    )
    return str(rows[0][0])


@pytest.mark.parametrize("written", ["before_upgrade", "after_upgrade"])
def test_a_fenced_key_voids_the_authorization_the_old_code_recorded(
    fresh: Backend, written: str
) -> None:
    """(a): past its issuer deadline the key is fenced, and the approved record is voided."""
    key = in_flight_key(fresh, deadline=60.0)
    if written == "before_upgrade":
        old_issuer_record(fresh, key)
        migrate(fresh.settings)
    else:
        migrate(fresh.settings)
        old_issuer_record(fresh, key)  # an old replica still serving during the rollout
    completer = drive(fresh, deadline=60.0)
    assert completer.recovered[Recovered.ABORTED] == 1
    assert state(fresh, key) == "aborted"
    assert count(fresh, "transaction", key) == 0
    # one record, the merchant's, voided: no authorization left standing under the key
    assert issuer_rows(fresh, key) == [(MERCHANT, "voided", 1)]


@pytest.mark.parametrize("written", ["before_upgrade", "after_upgrade"])
def test_a_re_driven_key_never_authorizes_twice(fresh: Backend, written: str) -> None:
    """(b): with a long issuer deadline the key is re-driven: the issuer answers its first
    decision (calls 2), one record, one transaction, one charge."""
    key = in_flight_key(fresh, deadline=3600.0)
    if written == "before_upgrade":
        old_issuer_record(fresh, key)
        migrate(fresh.settings)
    else:
        migrate(fresh.settings)
        old_issuer_record(fresh, key)
    completer = drive(fresh, deadline=3600.0)
    assert completer.recovered[Recovered.COMPLETED] == 1, completer.recovered
    assert state(fresh, key) == "completed"
    assert count(fresh, "transaction", key, "AND status = 'approved'") == 1
    assert count(fresh, "ledger_entry", key, "AND kind = 'charge'") == 1
    assert issuer_rows(fresh, key) == [(MERCHANT, "approved", 2)]


def test_0012_merges_split_records_into_the_one_that_tells_the_truth(fresh: Backend) -> None:
    """Databases that already split a key's record in two (the review's runs): 0012 keeps one
    record per issuer key under the merchant — voided if either was, else approved; calls
    summed — moves a lone '' record, and leaves a record no key row names as it is."""
    keys = {name: in_flight_key(fresh, deadline=60.0) for name in "abcde"}
    late = utcnow()
    # (a) as a038ec9 left it: 0008's backfilled approval, then the void under ''
    old_issuer_record(fresh, keys["a"], merchant_id=MERCHANT)
    old_issuer_record(fresh, keys["a"], result="voided", code=None, calls=0, voided_at=late)
    # (b) as a038ec9 left it: two approvals
    old_issuer_record(fresh, keys["b"], merchant_id=MERCHANT)
    old_issuer_record(fresh, keys["b"])
    # the flip side (0008 ran under a038ec9, then the current code): '' approved, a fresh void
    old_issuer_record(fresh, keys["c"])
    old_issuer_record(
        fresh, keys["c"], merchant_id=MERCHANT, result="voided", code=None, calls=0, voided_at=late
    )
    old_issuer_record(fresh, keys["d"])  # alone under '': moves
    fresh.sql("DELETE FROM idempotency_key WHERE key = :k", k=keys["e"])  # purged tombstone
    old_issuer_record(fresh, keys["e"], result="voided", code=None, calls=0, voided_at=late)
    migrate(fresh.settings)
    migrate(fresh.settings)  # idempotent: nothing left to move
    rows = fresh.sql(
        "SELECT issuer_key, merchant_id, result, authorization_code, calls,"
        " voided_at IS NOT NULL FROM issuer_authorization"
    )
    found = {str(k): tuple(r) for k, *r in rows}
    ik = {name: derive_issuer_key(SECRET, MERCHANT, key) for name, key in keys.items()}
    assert found == {
        ik["a"]: (MERCHANT, "voided", "0797C6", 1, True),
        ik["b"]: (MERCHANT, "approved", "0797C6", 2, False),
        ik["c"]: (MERCHANT, "voided", "0797C6", 1, True),
        ik["d"]: (MERCHANT, "approved", "0797C6", 1, False),
        ik["e"]: ("", "voided", None, 0, True),
    }


def test_0012_on_many_keys_moves_only_what_a_key_names(fresh: Backend) -> None:
    """Several batches (a small batch size): every '' record named by a key moves once."""
    module = ScriptDirectory.from_config(alembic_config(fresh.settings)).get_revision("0012").module
    keys = [str(uuid.uuid4()) for _ in range(23)]
    for key in keys:
        fresh.sql(
            "INSERT INTO idempotency_key (merchant_id, key, state, lease_token, created_at,"
            " updated_at) VALUES (:m, :k, 'completed', 1, :t, :t)",
            m=MERCHANT,
            k=key,
            t=T0,
        )
    for key in keys[::2]:
        old_issuer_record(fresh, key)

    async def run() -> dict[str, int]:
        engine = create_engine(fresh.settings)
        try:
            async with atomic(engine) as conn:
                return await conn.run_sync(lambda c: module.rehome(c, SECRET, batch=5))
        finally:
            await engine.dispose()

    assert asyncio.run(run()) == {"moved": 12, "merged": 0}
    assert asyncio.run(run()) == {"moved": 0, "merged": 0}
    owners = fresh.sql("SELECT merchant_id, count(*) FROM issuer_authorization GROUP BY 1")
    assert [tuple(r) for r in owners] == [(MERCHANT, 12)]


@pytest.mark.parametrize("deadline", [60.0, 3600.0], ids=["fenced", "re_driven"])
def test_an_old_record_written_after_the_process_started_is_adopted_at_once(
    fresh: Backend, deadline: float
) -> None:
    """A '' record an old replica writes while this process already runs (the rolling
    upgrade's window) is adopted by the very next re-drive or void of its key — no cached
    "none stored" may skip it (review s6) — voided with its key when fenced, answered
    again when re-driven."""
    migrate(fresh.settings)
    first = in_flight_key(fresh, deadline=deadline)
    adopts: list[str] = []

    async def run() -> str:
        settings = settings_for(fresh, deadline=deadline)
        engine = create_engine(settings)

        @event.listens_for(engine.sync_engine, "before_cursor_execute")
        def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            if statement.startswith("UPDATE issuer_authorization SET merchant_id"):
                adopts.append(statement)

        try:
            issuer = SimulatedIssuer(engine, slow_seconds=0)
            completer = Completer(TransactionService(engine, issuer, settings), interval=0.05)
            assert await completer.run_once() == 1  # the process at work: no '' record yet
            key = await asyncio.to_thread(in_flight_key, fresh, deadline=deadline)
            await asyncio.to_thread(old_issuer_record, fresh, key)  # an old replica's record
            await asyncio.sleep(0.5)  # `first`'s re-drive backoff (the completer's), not a look
            await completer.run_once()  # the key (and, re-driven, `first` once more)
            return key
        finally:
            await engine.dispose()

    key = asyncio.run(run())
    assert adopts  # the adoption was sent
    if deadline == 60.0:
        assert state(fresh, key) == "aborted"
        assert issuer_rows(fresh, key) == [(MERCHANT, "voided", 1)]
    else:
        assert state(fresh, first) == state(fresh, key) == "completed"
        assert issuer_rows(fresh, key) == [(MERCHANT, "approved", 2)]
        assert count(fresh, "transaction", key, "AND status = 'approved'") == 1
