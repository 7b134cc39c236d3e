"""SQL-injection strings in every field are inert: a 4xx, or a value stored verbatim; never a
5xx; the database afterwards intact. Both storage backends (the ``deployment`` fixture)."""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx

from api.auth import hash_key
from tests.api.conftest import Deployment
from tests.api.security.conftest import KeptApi
from tests.support.client import body, card, new_key

INJECTIONS = [
    "' OR '1'='1",
    '\'; DROP TABLE "transaction"; --',
    '"; DROP TABLE ledger_entry; --',
    "1; SELECT pg_sleep(3); --",
    "1'); CREATE TABLE sqli_ran (x int); --",  # would leave a table behind if it ever ran
    "' UNION SELECT key_hash, merchant_id FROM api_key --",
    "%' OR 1=1 --",
    "\\'; DELETE FROM idempotency_key; --",
    "Robert'); DROP TABLE api_key;--",
    "$$; DROP TABLE merchant; $$",
    "1' AND (SELECT 1 FROM sqlite_master) --",
    "'||(SELECT sql FROM sqlite_master)||'",
]
TABLES = ("merchant", "api_key", "idempotency_key", "transaction", "ledger_entry", "request_event")


def _counts(deployment: Deployment) -> dict[str, int]:
    return {table: deployment.count(table) for table in TABLES}


def _table_exists(deployment: Deployment, name: str) -> bool:
    if deployment.backend.name == "sqlite":
        found = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = :n"
    else:
        found = "SELECT count(*) FROM pg_tables WHERE tablename = :n"
    return int(deployment.backend.sql(found, n=name)[0][0]) > 0


def _merchant(deployment: Deployment, api: KeptApi) -> str:
    rows = deployment.backend.sql(
        "SELECT merchant_id FROM api_key WHERE key_hash = :h", h=hash_key(api.api_key)
    )
    return str(rows[0][0])


def test_injection_strings_in_every_field_are_inert(deployment: Deployment, api: KeptApi) -> None:
    before = _counts(deployment)
    merchant = _merchant(deployment, api)
    answers: list[tuple[str, httpx.Response]] = []
    stored: dict[str, dict[str, object]] = {}  # key -> metadata sent
    for sqli in INJECTIONS:
        metadata: dict[str, object] = {"note": sqli, sqli: sqli, "nested": {"k": [sqli]}}
        key = new_key()
        created = api.create(key, body(metadata=metadata))
        assert created.status_code == 201, (sqli, created.text)
        stored[key] = metadata
        for field, payload in {
            "terminal_id": body(terminal_id=sqli),
            "currency": body(currency=sqli),
            "type": body(type=sqli),
            "amount": body(amount=sqli),
            "captured_at": body(captured_at=sqli),
            "card.token": body(card=card(sqli)),
            "card.brand": body(card={**card("tok_visa_4242"), "brand": sqli}),
            "card.last4": body(card={**card("tok_visa_4242"), "last4": sqli}),
            "unknown field": {**body(), sqli: 1},
        }.items():
            answers.append((field, api.create(new_key(), payload)))
            assert answers[-1][1].status_code == 422, (field, sqli, answers[-1][1].text)
        for header in ("Idempotency-Attempt", "POS-Network", "X-Request-Id"):
            key = new_key()
            response = api.create(key, body(), **{header: sqli})
            assert response.status_code == 201, (header, sqli, response.text)
            stored[key] = {}
        answers.append(("Idempotency-Key", api.create(sqli, body())))
        assert answers[-1][1].status_code == 400
        answers.append(("Authorization", api.create(new_key(), body(), api_key=sqli)))
        assert answers[-1][1].status_code == 401
        with api.client() as client:
            for suffix in ("", "/abort", "/reversal"):
                path = f"/v1/transactions/{quote(sqli, safe='')}{suffix}"
                method = "GET" if not suffix else "POST"
                response = client.request(method, path, headers=api.headers(None))
                answers.append((f"path{suffix}", response))
                assert response.status_code in (400, 404), (path, response.text)
    # no statement in a string ran (the one that would leave a table behind did not)
    assert _table_exists(deployment, "sqli_ran") is False
    assert not [(field, r.status_code) for field, r in answers if r.status_code >= 500]
    for _field, response in answers:
        assert response.headers["content-type"].startswith("application/problem+json")

    after = _counts(deployment)  # every table still there; only our rows were added
    assert after["api_key"] == before["api_key"] and after["merchant"] == before["merchant"]
    assert after["transaction"] - before["transaction"] >= len(stored)
    rows = deployment.backend.sql(
        'SELECT id, metadata FROM "transaction" WHERE merchant_id = :m', m=merchant
    )
    saved = {row[0]: json.loads(row[1]) if row[1] else {} for row in rows}
    for key, metadata in stored.items():
        assert saved[key] == metadata  # stored verbatim, as data
    assert deployment.count("ledger_entry", merchant_id=merchant) >= len(stored)
    for key in stored:
        assert api.lookup(key).status_code == 200
