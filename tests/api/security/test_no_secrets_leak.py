"""API keys and card data never reach the log, the metrics, the lake or an error body.

One server with its own log file and a known IDEMPAY_SECRET_KEY; requests carrying a known
API key, a unique card token and a PAN in many places; then every output is searched."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from api.auth import hash_key
from api.db import create_engine
from api.events.export import export_day
from tests.api.security.conftest import Audited, log_records
from tests.support.client import assert_problem, body, new_key
from tests.support.eventually import eventually

SECRET = "sec-test-" + secrets.token_hex(8)
SERVER_ENV = {"IDEMPAY_SECRET_KEY": SECRET}
PAN = "4111111111111111"
PAN_SPACED = "4111 1111 1111 1111"
PAN_DASHED = "4111-1111-1111-1111"
AMEX = "378282246310005"
MARKER = "ZZSECRETMARKER"  # inside invalid card fields: must never be echoed


def _pan_bodies(token: str) -> dict[str, Any]:
    card = {"token": token, "last4": "1111", "brand": "visa"}
    return {
        "metadata value": body(card=card, metadata={"note": f"card {PAN_SPACED} ok"}),
        "metadata key": body(card=card, metadata={PAN: "x"}),
        "nested metadata": body(card=card, metadata={"a": [{"b": [AMEX]}]}),
        "card token": body(card={**card, "token": PAN}),
        "card last4": body(card={**card, "last4": PAN}),
        "card brand": body(card={**card, "brand": PAN_DASHED}),
        "terminal_id": body(card=card, terminal_id=PAN),
        "currency": body(card=card, currency=PAN),
        "amount (number)": body(card=card, amount=int(PAN)),
        "captured_at": body(card=card, captured_at=PAN),
        "unknown field": body(card=card, pan=PAN),
        "unknown card field": body(card={**card, "number": PAN_DASHED}),
    }


def _validation_bodies(token: str) -> dict[str, Any]:
    card = {"token": token, "last4": "1111", "brand": "visa"}
    return {
        "token bad chars": body(card={**card, "token": f"tok_{MARKER}-x!"}),
        "token too long": body(card={**card, "token": "tok_" + MARKER * 20}),
        "token not tok_": body(card={**card, "token": MARKER}),
        "token number": body(card={**card, "token": 12345}),
        "last4 letters": body(card={**card, "last4": MARKER[:4]}),
        "cvv field": body(card={**card, "cvv": MARKER}),
        "expiry field": body(card={**card, "exp": f"12/{MARKER}"}),
        "brand": body(card={**card, "brand": MARKER}),
        "terminal_id": body(card=card, terminal_id=f"{MARKER}!"),
        "type": body(card=card, type=MARKER),
        "amount": body(card=card, amount=MARKER),
        "currency": body(card=card, currency=MARKER),
        "captured_at": body(card=card, captured_at=MARKER),
        "installments": body(card=card, installments=MARKER),
        "metadata": body(card=card, metadata=MARKER),
        "card": body(card=MARKER),
    }


def _export(audited: Audited, lake: Path, days: set[Any]) -> None:
    async def run() -> None:
        engine = create_engine(audited.backend.settings)
        try:
            for day in sorted(days):
                await export_day(engine, lake, day)
        finally:
            await engine.dispose()

    asyncio.run(run())


def _lake_rows(lake: Path) -> dict[str, list[dict[str, Any]]]:
    tables: dict[str, list[dict[str, Any]]] = {}
    for part in sorted(lake.rglob("*.parquet")):
        table = part.relative_to(lake).parts[0]
        tables.setdefault(table, []).extend(pq.read_table(part).to_pylist())
    return tables


def test_keys_tokens_and_pans_never_leak(audited: Audited, tmp_path: Path) -> None:
    api = audited.api
    api_key, key_hash = api.api_key, hash_key(api.api_key)
    token = f"tok_sec_{secrets.token_hex(12)}"
    days = {datetime.now(UTC).date()}
    responses: list[httpx.Response] = []

    approved = api.create(new_key(), body(card={"token": token, "last4": "4242", "brand": "visa"}))
    assert approved.status_code == 201, approved.text
    responses.append(approved)
    responses.append(
        api.create(
            new_key(), body(card={"token": token, "last4": "4242", "brand": "visa"}, amount=77)
        )
    )
    for payload in _pan_bodies(token).values():
        response = api.create(new_key(), payload)
        assert_problem(response, 422, "pan_not_allowed")
        responses.append(response)
    for name, payload in _validation_bodies(token).items():
        response = api.create(new_key(), payload)
        problem = assert_problem(response, 422, "validation_error")
        assert problem["errors"], name
        for error in problem["errors"]:  # loc, msg, type only: never pydantic's input/ctx
            assert set(error) == {"loc", "msg", "type"}, (name, error)
        responses.append(response)
    with api.client() as client:
        for extra in (
            {"X-Request-Id": PAN},  # a safe-charset request id that is a PAN
            {"Idempotency-Key": PAN},
            {"Idempotency-Key": token},
            {"POS-Network": PAN},
            {"Idempotency-Attempt": PAN},
        ):
            headers = {**api.headers(new_key()), **extra}
            responses.append(client.post("/v1/transactions", json=body(), headers=headers))
        for path in (PAN, token, api_key):
            responses.append(client.get(f"/v1/transactions/{path}", headers=api.headers(None)))
            responses.append(
                client.post(f"/v1/transactions/{path}/abort", headers=api.headers(None))
            )
        for authorization in (f"Basic {api_key}", f"Bearer {api_key}x", f"Token {api_key}"):
            response = client.get(
                f"/v1/transactions/{new_key()}", headers={"Authorization": authorization}
            )
            assert_problem(response, 401, "unauthorized")
            responses.append(response)
        metrics = client.get("/metrics")
        assert metrics.status_code == 200
    assert [
        r.headers["x-request-id"] for r in responses if PAN in r.headers.get("x-request-id", "")
    ] == [PAN]  # echoed to its sender only, as sent
    # One worker's writer flushes its queue in order: once a last lookup's event is stored,
    # the events of every request above are too.
    last = new_key()
    assert api.lookup(last).status_code == 404
    eventually(
        lambda: audited.backend.sql(
            "SELECT 1 FROM request_event WHERE idempotency_key = :k", k=last
        ),
        what="the request events of the requests above (a last lookup's)",
    )
    days.add(datetime.now(UTC).date())
    lake = tmp_path / "lake"
    _export(audited, lake, days)
    tables = _lake_rows(lake)

    secrets_ = {
        "api key": api_key,
        "api key hash": key_hash,
        "api key hash prefix (rate-limit id)": key_hash[:16],
        "card token": token,
        "pan": PAN,
        "pan spaced": PAN_SPACED,
        "pan dashed": PAN_DASHED,
        "amex": AMEX,
        "marker": MARKER,
    }
    outputs = {
        "log": audited.log.read_text(),
        "metrics": metrics.text,
        "lake": repr(tables),
        "error bodies": "\n".join(r.text for r in responses if r.status_code >= 400),
        "response headers": "\n".join(
            f"{k}: {v}" for r in responses for k, v in r.headers.items() if k != "x-request-id"
        ),
    }
    for where, text in outputs.items():
        for what, value in secrets_.items():
            assert value not in text, f"{what} found in the {where}"

    parsed = [_json_or_none(line) for line in audited.log.read_text().splitlines()]
    records = [record for record in parsed if isinstance(record, dict)]
    assert any(r.get("request_id") == "[pan]" for r in records)  # the PAN request id, redacted
    merchant = audited.backend.sql(
        "SELECT merchant_id FROM api_key WHERE key_hash = :h", h=key_hash
    )[0][0]
    assert merchant not in metrics.text  # metrics labels carry no merchant
    ours = [row for row in tables["transactions"] if row["merchant_id"] == merchant]
    assert {row["amount"] for row in ours} == {1250, 77}
    expected = hmac.new(SECRET.encode(), token.encode(), hashlib.sha256).hexdigest()
    default = hmac.new(SECRET.encode(), b"tok_visa_4242", hashlib.sha256).hexdigest()
    assert [row["card_fingerprint"] for row in ours if row["amount"] == 77] == [expected]
    assert {row["card_fingerprint"] for row in ours} == {expected, default}  # keyed hashes
    assert hashlib.sha256(token.encode()).hexdigest() != expected
    assert not any("token" in column for table in tables.values() for column in table[0])
    events = [row for row in tables["request_events"] if row["merchant_id"] == merchant]
    assert len(events) >= 2 + len(_pan_bodies(token)) + len(_validation_bodies(token))
    log_records(audited.log)  # last: the log is well-formed JSON lines, every one of them


def _json_or_none(line: str) -> object:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None
