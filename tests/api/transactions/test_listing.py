"""``GET /v1/transactions`` (issue 16): a merchant's transactions for a terminal, in cursor
pages, on Postgres and on SQLite — another merchant's never appear."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.api.conftest import Deployment
from tests.support.client import Api, assert_problem, body, card, new_key


def _list(api: Api, api_key: str | None = None, **params: Any) -> httpx.Response:
    with api.client() as client:
        return client.get("/v1/transactions", params=params, headers=api.headers(None, api_key))


def _every_page(api: Api, **params: Any) -> tuple[list[dict[str, Any]], int]:
    rows: list[dict[str, Any]] = []
    pages, cursor = 0, None
    while True:
        response = _list(api, **params, **({"cursor": cursor} if cursor else {}))
        assert response.status_code == 200, response.text
        assert "idempotency-status" not in response.headers
        page = response.json()
        rows += page["data"]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            return rows, pages


def _since() -> str:
    return (datetime.now(UTC) - timedelta(seconds=5)).isoformat()


def test_pages_through_a_terminals_transactions_in_order(deployment: Deployment) -> None:
    terminal, since = f"T-L{uuid.uuid4().hex[:8]}", _since()
    keys = []
    for token in ["tok_visa_4242", "tok_decline_do_not_honor", "tok_visa_4242"] * 2:
        key = new_key()
        response = deployment.a.create(key, body(terminal_id=terminal, card=card(token)))
        assert response.status_code == 201
        keys.append(key)
    offline = new_key()
    captured = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
    advice = body(terminal_id=terminal, entry_mode="offline", captured_at=captured)
    assert deployment.a.create(offline, advice).status_code == 201
    keys.append(offline)
    deployment.a.create(new_key(), body(terminal_id=terminal + "x"))  # another terminal
    deployment.b.create(new_key(), body(terminal_id=terminal))  # another merchant

    rows, pages = _every_page(deployment.a, terminal_id=terminal, since=since, limit=2)
    assert pages == 4
    assert sorted(row["id"] for row in rows) == sorted(keys)  # each once, nothing else
    order = [(row["created_at"], row["id"]) for row in rows]
    assert order == sorted(order)
    assert {row["terminal_id"] for row in rows} == {terminal}
    by_id = {row["id"]: row for row in rows}
    assert by_id[offline]["offline"] is True
    assert sum(row["status"] == "declined" for row in rows) == 2
    assert deployment.a.lookup(keys[0]).json() == by_id[keys[0]]  # the same body as a lookup


def test_another_merchants_transactions_never_appear(deployment: Deployment) -> None:
    terminal, since = f"T-S{uuid.uuid4().hex[:8]}", _since()
    shared = new_key()  # two merchants may use the same UUID
    assert deployment.b.create(shared, body(terminal_id=terminal)).status_code == 201
    assert deployment.b.create(new_key(), body(terminal_id=terminal)).status_code == 201
    rows, _ = _every_page(deployment.a, terminal_id=terminal, since=since)
    assert rows == []
    assert deployment.a.create(shared, body(terminal_id=terminal, amount=99)).status_code == 201
    mine, _ = _every_page(deployment.a, terminal_id=terminal, since=since)
    assert [(row["id"], row["amount"]) for row in mine] == [(shared, 99)]
    merchant_wide, _ = _every_page(deployment.a, since=since, limit=500)
    assert [row["amount"] for row in merchant_wide if row["id"] == shared] == [99]
    theirs, _ = _every_page(deployment.b, terminal_id=terminal, since=since)
    assert len(theirs) == 2


def test_since_bounds_the_listing(deployment: Deployment) -> None:
    terminal = f"T-B{uuid.uuid4().hex[:8]}"
    assert deployment.a.create(new_key(), body(terminal_id=terminal)).status_code == 201
    later = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    page = _list(deployment.a, terminal_id=terminal, since=later).json()
    assert page == {"data": [], "next_cursor": None}


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({}, "since"),
        ({"since": "yesterday"}, "since"),
        ({"since": "2026-11-20T00:00:00"}, "since"),  # no time zone
        ({"since": "2026-W48-1T00:00Z"}, "since"),  # ISO 8601 week date
        ({"since": "2026-11-20T00:00:00Z\x00"}, "since"),  # trailing NUL
        ({"since": "2026-11-20T00:00:00Z\n"}, "since"),
        ({"since": "2026-11-20T00:00:00.123456789Z"}, "since"),  # nanoseconds: not cut
        ({"since": "2026-11-20T00:00:00.1234567Z"}, "since"),
        ({"since": "20261120T000000Z"}, "since"),  # ISO 8601 basic format
        ({"since": "2026-11-20 00:00:00Z"}, "since"),  # a space for T
        ({"since": "2026-11-20T00:00Z"}, "since"),  # no seconds
        ({"since": "2026-11-20T00:00:00+0100"}, "since"),
        ({"since": "2026-11-20T00:00:00+01"}, "since"),
        ({"since": "2026-11-20T00:00:00,5Z"}, "since"),
        ({"since": "2026-11-20T00:00:00.Z"}, "since"),
        ({"since": "2026-11-20T00:00:00+01:60"}, "since"),
        ({"since": "2026-02-30T00:00:00Z"}, "since"),
        ({"since": "2026-11-20T00:00:60Z"}, "since"),  # leap second: no such instant here
        ({"since": "\uff12026-11-20T00:00:00Z"}, "since"),  # a fullwidth digit
        ({"since": "0001-01-01T00:00:00+14:00"}, "since"),  # before year 1 in UTC
        ({"since": "2026-11-20T00:00:00Z", "limit": "\u00b2"}, "limit"),  # isdigit() is true
        ({"since": "2026-11-20T00:00:00Z", "limit": "+5"}, "limit"),
        ({"since": "2026-11-20T00:00:00Z", "limit": "1" + "0" * 5000}, "limit"),
        ({"since": "2026-11-20T00:00:00Z", "limit": "0"}, "limit"),
        ({"since": "2026-11-20T00:00:00Z", "limit": "501"}, "limit"),
        ({"since": "2026-11-20T00:00:00Z", "limit": "ten"}, "limit"),
        ({"since": "2026-11-20T00:00:00Z", "cursor": "not-a-cursor"}, "cursor"),
        ({"since": "2026-11-20T00:00:00Z", "terminal_id": "bad id!"}, "terminal_id"),
        ({"since": "2026-11-20T00:00:00Z", "merchant_id": "m"}, "merchant_id"),
    ],
)
def test_bad_parameters_are_problem_422(
    deployment: Deployment, params: dict[str, str], name: str
) -> None:
    problem = assert_problem(_list(deployment.a, **params), 422, "validation_error")
    assert name in str(problem["errors"])


@pytest.mark.parametrize(
    "since",
    [
        "2026-11-20T00:00:00Z",
        "2026-11-20t00:00:00z",  # RFC 3339 §5.6: T and Z may be lower case
        "2026-11-20T00:00:00.5Z",
        "2026-11-20T00:00:00.123456+00:00",
        "2026-11-19T21:00:00.000001-03:00",
    ],
)
def test_rfc3339_date_times_are_accepted(deployment: Deployment, since: str) -> None:
    response = _list(deployment.a, terminal_id=f"T-R{uuid.uuid4().hex[:8]}", since=since)
    assert response.status_code == 200, response.text
    assert response.json() == {"data": [], "next_cursor": None}


def test_since_keeps_its_microseconds(deployment: Deployment) -> None:
    terminal = f"T-M{uuid.uuid4().hex[:8]}"
    assert deployment.a.create(new_key(), body(terminal_id=terminal)).status_code == 201
    created = _list(deployment.a, terminal_id=terminal, since=_since()).json()["data"][0]
    at = datetime.fromisoformat(created["created_at"].replace("Z", "+00:00"))
    same = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    later = (at + timedelta(microseconds=1)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert [
        row["id"] for row in _list(deployment.a, terminal_id=terminal, since=same).json()["data"]
    ] == [created["id"]]
    assert _list(deployment.a, terminal_id=terminal, since=later).json()["data"] == []


def test_listing_needs_an_api_key(deployment: Deployment) -> None:
    response = _list(deployment.a, api_key="nope", since="2026-11-20T00:00:00Z")
    assert_problem(response, 401, "unauthorized")


def test_the_listing_is_in_the_openapi_document(deployment: Deployment) -> None:
    with deployment.a.client() as client:
        document = client.get("/openapi.json").json()
    operation = document["paths"]["/v1/transactions"]["get"]
    assert {p["name"] for p in operation["parameters"]} == {
        "terminal_id",
        "since",
        "limit",
        "cursor",
    }
    assert "422" in operation["responses"]
    page = document["components"]["schemas"]["TransactionPage"]
    assert set(page["properties"]) == {"data", "next_cursor"}
    assert "offline" in document["components"]["schemas"]["TransactionOut"]["required"]
    create = document["components"]["schemas"]["TransactionCreate"]["properties"]
    assert create["entry_mode"]["enum"] == ["online", "offline"]
