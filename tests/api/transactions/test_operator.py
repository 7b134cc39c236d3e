"""`idempay admin key show|fence|reverse` on every key state, on both backends: the tools go
through the HTTP routes' own code (a processed key is never fenced, a live request is never
taken from its terminal, a transaction is reversed once), and the operator's reason is in
the outbox event of the change it made, and nowhere else."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

from typer.testing import CliRunner, Result

from api.acquirer.host.store import summary
from api.cli import app
from api.db import create_engine
from api.idempotency import store
from tests.api.conftest import Deployment
from tests.support.backend import FAST_ENV, Backend
from tests.support.client import body, card, new_key
from tests.support.eventually import eventually

MERCHANT = "merchant-a"


def _idempay(backend: Backend, *args: str, **settings: str) -> Result:
    env = {**backend.env, **FAST_ENV, **settings}
    return CliRunner().invoke(app, ["admin", "key", *args], env=env)


def _verdict(result: Result) -> str:
    """The command's own answer: its last line (fence and reverse start the simulated
    acquirer's link first, whose log lines come before it)."""
    return result.output.rstrip("\n").rsplit("\n", 1)[-1]


def _advice(backend: Backend, key: str) -> list[tuple[str, bool]]:
    rows = backend.sql(
        "SELECT kind, acknowledged_at IS NOT NULL FROM acquirer_advice WHERE key = :key", key=key
    )
    return [(str(kind), bool(acked)) for kind, acked in rows]


def _show(backend: Backend, key: str, merchant: str = MERCHANT) -> str:
    done = _idempay(backend, "show", merchant, key)
    assert done.exit_code == 0, done.output
    return done.output


def _reasons(backend: Backend, key: str) -> list[tuple[str, str | None]]:
    rows = backend.sql(
        "SELECT type, payload FROM outbox_event WHERE transaction_id = :key ORDER BY id", key=key
    )
    return [(kind, json.loads(payload)["data"].get("reason")) for kind, payload in rows]


def test_unknown_key_is_fenced_with_the_reason_in_the_outbox(deployment: Deployment) -> None:
    backend, key = deployment.backend, new_key()
    assert "state: unknown" in _show(backend, key)

    refused = _idempay(backend, "reverse", MERCHANT, key, "--reason", "customer asked")
    assert refused.exit_code == 1 and "404 not_found" in refused.output

    fenced = _idempay(backend, "fence", MERCHANT, key.upper(), "--reason", "ticket 1234")
    assert fenced.exit_code == 0 and "the key is aborted" in fenced.output, fenced.output
    assert _reasons(backend, key) == [("transaction.aborted", "ticket 1234")]
    assert deployment.a.create(key).status_code == 410  # never processed now
    shown = _show(backend, key)
    assert "state: aborted" in shown and "reason='ticket 1234'" in shown


def test_approved_key_is_reversed_once_and_never_fenced(deployment: Deployment) -> None:
    backend, key = deployment.backend, new_key()
    assert deployment.a.create(key).status_code == 201
    shown = _show(backend, key)
    assert "state: completed" in shown and '"status":"approved"' in shown
    assert "ledger entries: 1" in shown and "charge 1250 BRL" in shown

    not_fenced = _idempay(backend, "fence", MERCHANT, key, "--reason", "wrong key")
    assert not_fenced.exit_code == 1 and "processed (approved)" in not_fenced.output

    first = _idempay(backend, "reverse", MERCHANT, key, "--reason", "customer left")
    again = _idempay(backend, "reverse", MERCHANT, key, "--reason", "clicked twice")
    assert first.exit_code == 0 and _verdict(first).startswith("reversed now"), first.output
    assert again.exit_code == 0 and _verdict(again).startswith("already reversed"), again.output
    assert _reasons(backend, key) == [
        ("transaction.completed", None),
        ("transaction.reversed", "customer left"),
    ]
    assert deployment.count("ledger_entry", transaction_id=key) == 2
    assert deployment.a.lookup(key).json()["status"] == "reversed"
    shown = _show(backend, key)
    assert '"status":"reversed"' in shown and "reversal -1250 BRL" in shown
    # one reversal advice, committed with the reversal; the 0400 (or the advice worker's
    # 0420) is acknowledged, and the acquirer has reversed the one 0200 it approved
    eventually(lambda: _advice(backend, key) == [("reversal", True)], what="the 0410/0430")
    rrn = backend.sql('SELECT rrn FROM "transaction" WHERE id = :key', key=key)[0][0]
    acquirer = summary(backend.tmp / "var" / "acquirer.sqlite3")[rrn]
    assert (acquirer.requests, acquirer.approved, acquirer.reversed) == (1, True, True)


def test_declined_key_is_neither_fenced_nor_reversed(deployment: Deployment) -> None:
    backend, key = deployment.backend, new_key()
    declined = deployment.a.create(key, body(card=card("tok_decline_do_not_honor")))
    assert declined.json()["status"] == "declined"
    shown = _show(backend, key)
    assert "state: completed" in shown and "ledger entries: 0" in shown

    reversal = _idempay(backend, "reverse", MERCHANT, key, "--reason", "r")
    fence = _idempay(backend, "fence", MERCHANT, key, "--reason", "r")
    assert reversal.exit_code == 1 and "422 not_reversible" in reversal.output
    assert fence.exit_code == 1 and "processed (declined)" in fence.output
    assert _reasons(backend, key) == [("transaction.completed", None)]


def test_fenced_keys_stay_as_they_are(deployment: Deployment) -> None:
    backend, aborted, expired = deployment.backend, new_key(), new_key()
    assert deployment.a.abort(aborted).status_code == 200
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    assert deployment.a.create(expired, body(expires_at=past)).status_code == 410
    for key, state in ((aborted, "aborted"), (expired, "expired")):
        assert f"state: {state}" in _show(backend, key)
        fence = _idempay(backend, "fence", MERCHANT, key, "--reason", "again")
        reversal = _idempay(backend, "reverse", MERCHANT, key, "--reason", "again")
        assert fence.exit_code == 0 and f"the key is {state}" in fence.output
        assert reversal.exit_code == 1 and "422 not_reversible" in reversal.output
    assert _reasons(backend, aborted) == [("transaction.aborted", None)]
    assert _reasons(backend, expired) == []


def test_request_events_and_other_merchants(deployment: Deployment) -> None:
    backend, key = deployment.backend, new_key()
    deployment.a.lookup(key)
    deployment.a.create(key, **{"Idempotency-Attempt": "3"})
    for _ in range(100):  # the server's event writer flushes every 50 ms
        shown = _show(backend, key)
        if "request events: 2" in shown:
            break
        asyncio.run(asyncio.sleep(0.05))
    assert "lookup not_found 404" in shown and "create created 201 attempt=3" in shown
    assert "highest Idempotency-Attempt 3" in shown
    assert "state: unknown" in _show(backend, key, "merchant-b")  # scoped per merchant
    assert _idempay(backend, "show", "nobody", key).exit_code == 1
    assert _idempay(backend, "show", MERCHANT, "not-a-uuid").exit_code != 0
    assert _idempay(backend, "fence", MERCHANT, key, "--reason", " ").exit_code != 0


def _claim(backend: Backend, merchant_id: str, key: str, *, age: float, lease: float) -> None:
    async def run() -> None:
        engine = create_engine(backend.settings)
        try:
            async with engine.begin() as conn:
                await store.claim(
                    conn,
                    store.claim_row(
                        merchant_id=merchant_id,
                        key=key,
                        fingerprint="f" * 64,
                        request=json.dumps(body()),
                        terminal_id="T-0001",
                        now=datetime.now(UTC) - timedelta(seconds=age),
                        lease_until=datetime.now(UTC) - timedelta(seconds=age - lease),
                        deadline_s=3600,
                    ),
                )
        finally:
            await engine.dispose()

    asyncio.run(run())


def test_processing_key_is_fenced_only_once_its_terminal_cannot_answer(
    private_backend: Backend,
) -> None:
    backend = private_backend
    backend.api_key(MERCHANT)
    merchant_id = backend.sql("SELECT id FROM merchant WHERE name = :n", n=MERCHANT)[0][0]
    live, abandoned = new_key(), new_key()
    _claim(backend, merchant_id, live, age=0, lease=600)
    _claim(backend, merchant_id, abandoned, age=60, lease=1)

    shown = _show(backend, live)
    assert "state: processing" in shown and "(live)" in shown
    for action in ("fence", "reverse"):
        # within its answer time (IDEMPAY_ANSWER_WITHIN + 0.5 s of the claim, long here so
        # that a slow start of the command cannot outlast it) the request may still answer
        # its terminal: left alone
        refused = _idempay(
            backend, action, MERCHANT, live, "--reason", "stuck?", IDEMPAY_ANSWER_WITHIN="600"
        )
        assert refused.exit_code == 1 and "409 request_in_progress" in refused.output
    assert _reasons(backend, live) == []
    assert _advice(backend, live) == []
    assert "state: processing" in _show(backend, live)

    assert "(expired)" in _show(backend, abandoned)
    fenced = _idempay(backend, "fence", MERCHANT, abandoned, "--reason", "terminal gone")
    assert fenced.exit_code == 0 and "the key is aborted" in fenced.output, fenced.output
    assert _reasons(backend, abandoned) == [("transaction.aborted", "terminal gone")]
    assert "lease owner(s)" in _show(backend, abandoned)
    # its 0200 may have left: the reversal advice is queued with the fence
    assert [kind for kind, _ in _advice(backend, abandoned)] == ["abort"]
