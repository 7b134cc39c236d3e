"""The duplicate guard at the counter (issue 17, part 3; contract §2.2), on SQLite and on
Postgres: off, on, overridden; what it never blocks; the check in the claim's transaction,
before the 0200 leaves (a slow acquirer, a key the completer settles); new keys racing for
the same sale; what the check costs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import event, select

from api.db import utcnow
from api.events.writer import RequestOutcome
from api.models import Transaction
from api.transactions.guard import Guard, find_suspect, lock_key, set_window
from api.transactions.outcome import Outcome
from tests.api.guard.conftest import Merchant, new_key, new_merchant
from tests.support.client import assert_problem, body, card
from tests.support.eventually import eventually_async

OVERRIDE = {"allow_duplicate": True}


def blocked(response: httpx.Response, duplicate_of: str) -> dict[str, Any]:
    problem = assert_problem(response, 409, "suspected_duplicate")
    assert problem["duplicate_of"] == duplicate_of
    assert problem["type"] == "urn:idempay:problem:suspected_duplicate"
    assert response.headers["Idempotency-Status"] == "not_found"
    assert "Retry-After" not in response.headers  # resending as is gets the same answer
    return problem


async def nothing_stored(merchant: Merchant, key: str) -> None:
    assert await merchant.stored(key) == {
        "key": 0,
        "transaction": 0,
        "ledger": 0,
        "outbox": 0,
        "advice": 0,
        "acquirer": 0,  # the acquirer was never asked: no 0200 for the key's RRN
    }
    lookup = await merchant.lookup(key)
    assert lookup.status_code == 404


async def test_guard_off_never_blocks(unguarded: Merchant) -> None:
    first, second = new_key(), new_key()
    assert (await unguarded.create(first)).status_code == 201
    response = await unguarded.create(second)
    assert response.status_code == 201, response.text
    assert (await unguarded.transaction(second))[:2] in (("approved", False), ("approved", 0))


async def test_guard_on_blocks_a_second_key_and_stores_nothing(guarded: Merchant) -> None:
    first, second = new_key(), new_key()
    assert (await guarded.create(first)).status_code == 201
    blocked(await guarded.create(second), first)
    await nothing_stored(guarded, second)
    assert await guarded.create_events(second) == [("rejected", 409)]
    blocked(await guarded.create(second), first)  # the same answer again: nothing changed
    await nothing_stored(guarded, second)


async def test_the_cashier_overrides_with_the_same_key(guarded: Merchant) -> None:
    first, second = new_key(), new_key()
    original = await guarded.create(first)
    assert original.status_code == 201
    blocked(await guarded.create(second, body(metadata={"till": 3})), first)
    confirmed = await guarded.create(second, body(metadata={"till": 3}, **OVERRIDE))
    assert confirmed.status_code == 201, confirmed.text
    assert confirmed.headers["Idempotency-Status"] == "created"
    assert "allow_duplicate" not in confirmed.json()
    status, override, metadata = await guarded.transaction(second)
    assert (status, bool(override)) == ("approved", True)
    assert json.loads(metadata) == {"till": 3}  # the cashier's instruction is not metadata
    assert await guarded.stored(second) == {
        "key": 1,
        "transaction": 1,
        "ledger": 1,
        "outbox": 1,
        "advice": 0,
        "acquirer": 1,  # exactly one 0200
    }
    # replays of the overridden key: with or without allow_duplicate (not in the fingerprint)
    for again in (body(metadata={"till": 3}, **OVERRIDE), body(metadata={"till": 3})):
        replay = await guarded.create(second, again)
        assert replay.status_code == 201, replay.text
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert replay.content == confirmed.content
    assert not bool((await guarded.transaction(first))[1])
    events = await guarded.create_events(second, count=4)  # refused, created, two replays
    assert events == [("rejected", 409), ("created", 201), ("replayed", 201), ("replayed", 201)]


async def test_allow_duplicate_without_a_suspect_is_no_override(guarded: Merchant) -> None:
    key = new_key()
    assert (await guarded.create(key, body(**OVERRIDE))).status_code == 201
    assert not bool((await guarded.transaction(key))[1])


async def test_allow_duplicate_with_the_guard_off_is_no_override(unguarded: Merchant) -> None:
    first, second = new_key(), new_key()
    assert (await unguarded.create(first)).status_code == 201
    assert (await unguarded.create(second, body(**OVERRIDE))).status_code == 201
    assert not bool((await unguarded.transaction(second))[1])


async def test_allow_duplicate_must_be_a_boolean(guarded: Merchant) -> None:
    response = await guarded.create(new_key(), body(allow_duplicate="yes"))
    assert_problem(response, 422, "validation_error")


async def test_a_replay_is_never_blocked(guarded: Merchant) -> None:
    first, second = new_key(), new_key()
    assert (await guarded.create(first)).status_code == 201
    second_body = body(**OVERRIDE)
    assert (await guarded.create(second, second_body)).status_code == 201
    # both keys now have a twin within the window: their replays still replay
    for key, payload in ((first, body()), (second, second_body)):
        replay = await guarded.create(key, payload)
        assert replay.status_code == 201
        assert replay.headers["Idempotent-Replayed"] == "true"


async def test_outside_the_window_is_not_blocked(app: FastAPI, http: httpx.AsyncClient) -> None:
    merchant = await new_merchant(app, http, 30)
    first, second, third = new_key(), new_key(), new_key()
    assert (await merchant.create(first)).status_code == 201
    moved = utcnow() - timedelta(seconds=40)  # the first sale, 40 s ago: outside 30 s
    await merchant.sql('UPDATE "transaction" SET created_at = :t WHERE id = :k', t=moved, k=first)
    assert (await merchant.create(second)).status_code == 201
    moved = utcnow() - timedelta(seconds=25)  # the second, 25 s ago: inside
    await merchant.sql('UPDATE "transaction" SET created_at = :t WHERE id = :k', t=moved, k=second)
    blocked(await merchant.create(third), second)


async def test_a_declined_earlier_sale_does_not_block(guarded: Merchant) -> None:
    declined = body(card=card("tok_decline_insufficient_funds"))
    first, second = new_key(), new_key()
    assert (await guarded.create(first, declined)).json()["status"] == "declined"
    retried = await guarded.create(second, declined)
    assert retried.status_code == 201
    assert retried.json()["status"] == "declined"


async def test_a_reversed_earlier_sale_does_not_block(guarded: Merchant) -> None:
    first, second = new_key(), new_key()
    assert (await guarded.create(first)).status_code == 201
    assert (await guarded.reverse(first)).status_code == 200
    assert (await guarded.create(second)).status_code == 201


async def test_refunds_are_not_guarded(guarded: Merchant) -> None:
    refund = body(type="refund")
    first, second, third = new_key(), new_key(), new_key()
    assert (await guarded.create(first)).status_code == 201  # a purchase
    assert (await guarded.create(second, refund)).status_code == 201
    assert (await guarded.create(third, refund)).status_code == 201


async def test_a_refund_is_no_suspect_for_a_purchase(guarded: Merchant) -> None:
    first, second = new_key(), new_key()
    assert (await guarded.create(first, body(type="refund"))).status_code == 201
    assert (await guarded.create(second)).status_code == 201


async def test_an_offline_advice_is_not_blocked(guarded: Merchant) -> None:
    first, second = new_key(), new_key()
    assert (await guarded.create(first)).status_code == 201
    advice = body(entry_mode="offline", captured_at=(utcnow() - timedelta(seconds=5)).isoformat())
    response = await guarded.create(second, advice)
    assert response.status_code == 201, response.text
    assert response.json()["offline"] is True


@pytest.mark.parametrize(
    "other",
    [
        {"terminal_id": "T-0002"},
        {"card": card("tok_mastercard_5555")},
        {"amount": 1251},
        {"currency": "USD"},
    ],
    ids=["terminal", "card", "amount", "currency"],
)
async def test_another_terminal_card_amount_or_currency_is_not_blocked(
    guarded: Merchant, other: dict[str, Any]
) -> None:
    assert (await guarded.create(new_key())).status_code == 201
    assert (await guarded.create(new_key(), body(**other))).status_code == 201


async def test_another_merchants_sale_is_not_a_suspect(
    app: FastAPI, http: httpx.AsyncClient
) -> None:
    one = await new_merchant(app, http, 120)
    two = await new_merchant(app, http, 120)
    assert (await one.create(new_key())).status_code == 201
    assert (await two.create(new_key())).status_code == 201


async def test_a_setting_changes_with_the_next_key_load(
    app: FastAPI, http: httpx.AsyncClient
) -> None:
    """The window comes with the API key: a merchant's setting is read when its key is
    loaded (here: a new process's first request) — in a running one within the cache's
    minute. Turning it off is read the same way."""
    merchant = await new_merchant(app, http, 120)
    first = new_key()
    assert (await merchant.create(first)).status_code == 201
    blocked(await merchant.create(new_key()), first)
    await set_window(app.state.ctx.engine, merchant.name, None)
    app.state.ctx.auth._cache.clear()  # what a minute does
    assert (await merchant.create(new_key())).status_code == 201


# -------------------------------------------------------------- the claim path


async def test_the_general_path_guards_too(
    guarded: Merchant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the hot path's key reader (as for an in-memory SQLite: every read through
    SQLAlchemy): the check is the same, in the transaction that claims the key, before the
    0200 leaves."""
    monkeypatch.setattr(guarded.app.state.ctx.service, "inline", None)
    first, second = new_key(), new_key()
    assert (await guarded.create(first)).status_code == 201
    blocked(await guarded.create(second), first)
    await nothing_stored(guarded, second)
    assert (await guarded.create(second, body(**OVERRIDE))).status_code == 201
    assert bool((await guarded.transaction(second))[1])


async def test_a_slow_issuers_sale_is_checked_at_its_claim(guarded: Merchant) -> None:
    slow = body(card=card("tok_issuer_slow"))
    first, second, third = new_key(), new_key(), new_key()
    assert (await guarded.create(first, slow)).status_code == 201
    blocked(await guarded.create(second, slow), first)
    await nothing_stored(guarded, second)  # the claim was undone; the acquirer never asked
    overridden = await guarded.create(second, {**slow, **OVERRIDE})
    assert overridden.status_code == 201, overridden.text
    assert bool((await guarded.transaction(second))[1])
    blocked(await guarded.create(third, slow), second)


async def test_an_override_the_completer_finishes_keeps_its_flag(
    guarded: Merchant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The overridden key's process dies right after its claim (its 0200 may or may not have
    left): the create answered 202, and once the lease runs out the completer settles the key
    from the request stored at the claim — declined / acquirer_timeout, its 0420 reversal
    advice queued and acknowledged, never a 0200 of its own — and that request records the
    override."""
    first, second = new_key(), new_key()
    assert (await guarded.create(first)).status_code == 201
    blocked(await guarded.create(second), first)
    service = guarded.app.state.ctx.service

    async def dies_after_the_claim(merchant_id: str, key: str, payload: Any, **_: Any) -> Outcome:
        outcome: Outcome = service.processing(key, payload.terminal_id, RequestOutcome.CREATED)
        return outcome

    monkeypatch.setattr(service, "drive", dies_after_the_claim)
    response = await guarded.create(second, body(**OVERRIDE))
    assert response.status_code == 202, response.text
    monkeypatch.undo()
    settled = await _settled(guarded, second, within=60)
    assert (settled["status"], settled["decline_reason"]) == ("declined", "acquirer_timeout")
    assert bool((await guarded.transaction(second))[1])  # from the stored request

    async def advices() -> list[Any]:
        return await guarded.sql(
            "SELECT kind, acknowledged_at FROM acquirer_advice WHERE key = :k", k=second
        )

    rows: list[Any] = await eventually_async(
        advices,
        what="the settlement's reversal advice acknowledged",
        until=lambda rows: len(rows) == 1 and rows[0][1] is not None,
        timeout=30,
    )
    assert rows[0][0] == "timeout"
    assert (await guarded.stored(second))["acquirer"] == 0  # the completer sent no 0200


async def _settled(merchant: Merchant, key: str, *, within: float = 10) -> dict[str, Any]:
    async def lookup() -> httpx.Response:
        return await merchant.lookup(key)

    response: httpx.Response = await eventually_async(
        lookup,
        what=f"{key} settled",
        until=lambda r: r.status_code == 200,
        timeout=within,
    )
    return dict(response.json())


# -------------------------------------------------------------- racing keys


async def racing_keys_charge_once(guarded: Merchant, racers: int) -> None:
    """``racers`` new keys racing for a sale already approved: every one is refused, each
    naming it — the sale is charged once."""
    first = new_key()
    assert (await guarded.create(first)).status_code == 201
    keys = [new_key() for _ in range(racers)]
    responses = await asyncio.gather(*(guarded.create(key) for key in keys))
    for response in responses:
        blocked(response, first)
    for key in keys:
        await nothing_stored(guarded, key)
    rows = await guarded.sql(
        'SELECT count(*) FROM "transaction" WHERE merchant_id = :m',
        m=await guarded.merchant_id(),
    )
    assert rows[0][0] == 1


async def test_new_keys_racing_for_one_sale_charge_once(guarded: Merchant) -> None:
    """New keys racing for a sale already approved: every one is refused, each naming it —
    the sale is charged once."""
    await racing_keys_charge_once(guarded, 8)


async def test_new_keys_racing_while_none_is_approved_yet(guarded: Merchant) -> None:
    """Contract §2.2: the guard orders the claims, not the sales — a sale is invisible to it
    until its transaction is written, after the acquirer's answer, so new keys claimed while
    another is still at the acquirer are not blocked by it. What holds: each key is either
    charged (201, one 0200, one approved transaction) or refused naming an approved sale of
    the race, with nothing stored; at least one is charged."""
    keys = [new_key() for _ in range(8)]
    responses = await asyncio.gather(*(guarded.create(key) for key in keys))
    charged = [key for key, r in zip(keys, responses, strict=True) if r.status_code == 201]
    assert charged, [r.text for r in responses]
    for key, response in zip(keys, responses, strict=True):
        if key in charged:
            assert response.json()["status"] == "approved"
            assert (await guarded.stored(key))["acquirer"] == 1
        else:
            problem = assert_problem(response, 409, "suspected_duplicate")
            blocked(response, problem["duplicate_of"])
            assert problem["duplicate_of"] in charged
            await nothing_stored(guarded, key)
    rows = await guarded.sql(
        'SELECT count(*) FROM "transaction" WHERE merchant_id = :m',
        m=await guarded.merchant_id(),
    )
    assert rows[0][0] == len(charged)


async def test_the_window_is_inclusive_at_both_ends(guarded: Merchant) -> None:
    """The probe itself, at the window's edges (to the microsecond), on both backends —
    and on Postgres migration 0010's SQL function too (no create calls it any more)."""
    first = new_key()
    assert (await guarded.create(first)).status_code == 201
    ctx = guarded.app.state.ctx
    merchant_id = await guarded.merchant_id()
    fingerprint = ctx.service.card_fingerprint(body()["card"]["token"])
    lock = lock_key(merchant_id, "T-0001", fingerprint, 1250, "BRL")
    guard = Guard(window_s=120, allow=False, card_fingerprint=fingerprint, lock=lock)
    async with ctx.engine.connect() as conn:
        created = (
            await conn.execute(select(Transaction.created_at).where(Transaction.id == first))
        ).scalar_one()
    window, tick = timedelta(seconds=120), timedelta(microseconds=1)
    cases = {
        created + window: first,
        created - window: first,
        created + window + tick: None,
        created - window - tick: None,
    }
    for moment, expected in cases.items():
        async with ctx.engine.begin() as conn:
            found = await find_suspect(
                conn,
                guard,
                merchant_id=merchant_id,
                key=new_key(),
                terminal_id="T-0001",
                amount=1250,
                currency="BRL",
                created_at=moment,
            )
        assert found == expected, moment
        if ctx.engine.dialect.name == "postgresql":
            since, until = guard.bounds(moment)
            rows = await guarded.sql(
                "SELECT idempay_duplicate_of(:m, 'T-0001', :f, 1250, 'BRL', :s, :u, :k, :l)",
                m=merchant_id,
                f=fingerprint,
                s=since,
                u=until,
                k=new_key(),
                l=lock,
            )
            assert rows[0][0] == expected, moment
    async with ctx.engine.begin() as conn:  # its own key is never its own suspect
        assert (
            await find_suspect(
                conn,
                guard,
                merchant_id=merchant_id,
                key=first,
                terminal_id="T-0001",
                amount=1250,
                currency="BRL",
                created_at=created,
            )
            is None
        )


# -------------------------------------------------------------- what it costs


async def test_the_guard_off_costs_no_statement_and_on_costs_no_round_trip(
    app: FastAPI, http: httpx.AsyncClient
) -> None:
    """Every statement of a create's database transactions, recorded: off, the claim's
    transaction runs no statement of the guard; on, the claim's transaction is the very
    statements of before plus the guard's (the advisory lock on Postgres, the probe), all
    before the key's INSERT — inside it, not a transaction or round trip to the database of
    its own — and the create opens no more transactions than with the guard off."""
    engine = app.state.ctx.engine.sync_engine
    postgres = engine.dialect.name == "postgresql"
    open_: dict[int, list[str]] = {}
    done: list[list[str]] = []

    def begin(conn: Any) -> None:
        open_[id(conn)] = []

    def statement(conn: Any, _cursor: Any, sql: str, params: Any, *_: Any) -> None:
        if id(conn) in open_:
            open_[id(conn)].append(f"{sql}\x00{params!r}")

    def end(conn: Any) -> None:
        if (statements := open_.pop(id(conn), None)) is not None:
            done.append(statements)

    def transactions_of(key: str) -> list[list[str]]:
        """The committed transactions whose statements name ``key``, without parameters."""
        return [
            [recorded.split("\x00")[0] for recorded in statements]
            for statements in done
            if any(key in recorded for recorded in statements)
        ]

    def is_guard(sql: str) -> bool:
        probe = sql.lstrip().upper().startswith("SELECT") and "card_fingerprint" in sql
        return probe or "pg_advisory_xact_lock" in sql

    off = await new_merchant(app, http, None)
    on = await new_merchant(app, http, 120)
    for merchant in (off, on):
        assert (await merchant.create(new_key())).status_code == 201  # loads the API key
    listeners: dict[str, Callable[..., None]] = {
        "begin": begin,
        "before_cursor_execute": statement,
        "commit": end,
    }
    for name, listener in listeners.items():
        event.listen(engine, name, listener)
    try:
        off_key, on_key = new_key(), new_key()
        assert (await off.create(off_key, body(terminal_id="T-cost"))).status_code == 201
        assert (await on.create(on_key, body(terminal_id="T-cost"))).status_code == 201
    finally:
        for name, listener in listeners.items():
            event.remove(engine, name, listener)

    def claim(transactions: list[list[str]]) -> list[str]:
        (found,) = [t for t in transactions if any(_inserts_the_key(sql) for sql in t)]
        return found

    off_txns, on_txns = transactions_of(off_key), transactions_of(on_key)
    assert not any(is_guard(sql) for txn in off_txns for sql in txn), off_txns
    assert len(on_txns) == len(off_txns), (off_txns, on_txns)  # no transaction of its own
    on_claim = claim(on_txns)
    guard = [sql for sql in on_claim if is_guard(sql)]
    assert len(guard) == (2 if postgres else 1), on_claim  # lock (Postgres), then the probe
    if postgres:
        assert "pg_advisory_xact_lock" in guard[0]
    inserted = next(i for i, sql in enumerate(on_claim) if _inserts_the_key(sql))
    assert all(on_claim.index(sql) < inserted for sql in guard)  # before the claim's INSERT
    assert [sql for sql in on_claim if not is_guard(sql)] == claim(off_txns)
    others = [txn for txn in on_txns if txn is not on_claim]
    assert not any(is_guard(sql) for txn in others for sql in txn)


def _inserts_the_key(sql: str) -> bool:
    return sql.lstrip().upper().startswith("INSERT") and "idempotency_key" in sql
