"""The duplicate guard at the counter (issue 17, part 3; contract §2.2), on SQLite and on
Postgres: off, on, overridden; what it never blocks; the general path (Citus's) and the
phased path (a slow issuer); two new keys racing for the same sale."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from api.db import utcnow
from api.models import Transaction
from api.transactions.guard import Guard, find_suspect, lock_key, set_window
from tests.api.guard.conftest import Merchant, new_key, new_merchant
from tests.support.client import assert_problem, body, card

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
        "issuer": 0,  # the issuer was never asked
        "outbox": 0,
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
        "issuer": 1,
        "outbox": 1,
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


# -------------------------------------------------------------- the other paths


async def test_the_general_path_guards_too(
    guarded: Merchant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the one-write writer (as on Citus): the check in the transaction that
    inserts the key, before the issuer."""
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
    await nothing_stored(guarded, second)  # the claim was undone; the issuer never asked
    overridden = await guarded.create(second, {**slow, **OVERRIDE})
    assert overridden.status_code == 201, overridden.text
    assert bool((await guarded.transaction(second))[1])
    blocked(await guarded.create(third, slow), second)


async def test_an_override_the_completer_finishes_keeps_its_flag(guarded: Merchant) -> None:
    """tok_issuer_timeout misses the first call: the create answers 202 and the server
    finishes the key from the request stored at the claim — which records the override."""
    timeout = body(card=card("tok_issuer_timeout"))
    first, second = new_key(), new_key()
    assert (await guarded.create(first, timeout)).status_code in (201, 202)
    settled = await _settled(guarded, first)
    assert settled["status"] == "approved"
    blocked(await guarded.create(second, timeout), first)
    response = await guarded.create(second, {**timeout, **OVERRIDE})
    assert response.status_code == 202, response.text
    assert (await _settled(guarded, second))["status"] == "approved"
    assert bool((await guarded.transaction(second))[1])


async def _settled(merchant: Merchant, key: str) -> dict[str, Any]:
    for _ in range(200):
        response = await merchant.lookup(key)
        if response.status_code == 200:
            return dict(response.json())
        await asyncio.sleep(0.05)
    raise AssertionError(f"{key} did not settle")


# -------------------------------------------------------------- racing keys


@pytest.mark.parametrize("path", ["one-write", "general"])
async def test_new_keys_racing_for_one_sale_charge_once(
    guarded: Merchant, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    if path == "general":
        monkeypatch.setattr(guarded.app.state.ctx.service, "inline", None)
    keys = [new_key() for _ in range(8)]
    responses = await asyncio.gather(*(guarded.create(key) for key in keys))
    statuses = sorted(response.status_code for response in responses)
    assert statuses == [201] + [409] * 7, [r.text for r in responses]
    (winner,) = [key for key, r in zip(keys, responses, strict=True) if r.status_code == 201]
    for key, response in zip(keys, responses, strict=True):
        if key != winner:
            blocked(response, winner)
    rows = await guarded.sql(
        'SELECT count(*) FROM "transaction" WHERE merchant_id = :m',
        m=await guarded.merchant_id(),
    )
    assert rows[0][0] == 1


async def test_the_window_is_inclusive_at_both_ends(guarded: Merchant) -> None:
    """The probe itself, at the window's edges (to the microsecond), on both backends —
    and on Postgres the one-write statement's function too."""
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
    app: FastAPI, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every write of a one-write create, recorded: off, the statement it always was (one
    round trip; on Postgres with group commit, its batch's one statement); on, one statement
    still — the check is inside it."""
    inline = app.state.ctx.service.inline
    seen: list[Any] = []
    if app.state.ctx.engine.dialect.name == "postgresql":
        from api.transactions import pg_create

        real_call = inline._call

        async def call(method: str, statement: str, *args: Any) -> Any:
            seen.append(statement)
            return await real_call(method, statement, *args)

        monkeypatch.setattr(inline, "_call", call)
        plain, guarded_kind = pg_create.CREATE, pg_create.CREATE_GUARDED
        if inline.group is not None:  # group commit: the unguarded create rides a batch
            from api.transactions import pg_group

            real_send = inline.group._send

            async def send(batch: Any) -> None:
                seen.append(pg_group.CREATE_MANY)  # one statement per batch
                await real_send(batch)

            monkeypatch.setattr(inline.group, "_send", send)
            plain = pg_group.CREATE_MANY
    else:
        from api.transactions import sqlite_create

        real_submit = inline.writer.submit

        async def submit(job: Any) -> Any:
            if not isinstance(job, sqlite_create.EventRows):  # request events ride it too
                seen.append(job)
            return await real_submit(job)

        monkeypatch.setattr(inline.writer, "submit", submit)
        plain, guarded_kind = list, sqlite_create.GuardedWork

    off = await new_merchant(app, http, None)
    on = await new_merchant(app, http, 120)
    for merchant in (off, on):
        assert (await merchant.create(new_key())).status_code == 201  # loads the API key
    seen.clear()
    assert (await off.create(new_key(), body(terminal_id="T-cost"))).status_code == 201
    assert len(seen) == 1
    if isinstance(plain, str):
        assert seen[0] == plain
    else:
        assert type(seen[0]) is plain  # the very statements of before: a plain list
    seen.clear()
    assert (await on.create(new_key(), body(terminal_id="T-cost"))).status_code == 201
    assert len(seen) == 1
    if isinstance(guarded_kind, str):
        assert seen[0] == guarded_kind
    else:
        assert isinstance(seen[0], guarded_kind)
