"""Review finding B (contract §2.7, §2.2): ``GET /v1/transactions`` answered 500 for a
``since`` or a cursor at the extremes of the datetime range with an offset, and on Postgres
for a cursor whose id held a NUL byte; it took ``cursor=`` for no cursor and accepted a
hand-crafted cursor. Every such input is now 422 ``validation_error`` naming the parameter:
the cursor is signed with the server's secret and bound to the merchant, ``terminal_id``
and ``since`` it was returned for. The create's timestamps at the same extremes are 422 too,
never a 5xx. On Postgres and SQLite."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

from tests.api.conftest import Deployment
from tests.support.client import Api, assert_problem, body, new_key

EXTREMES = ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"]


def _list(api: Api, **params: Any) -> httpx.Response:
    with api.client() as client:
        return client.get("/v1/transactions", params=params, headers=api.headers(None, None))


def _cursor(*position: Any) -> str:
    """A cursor in the format the endpoint returned before the review: unsigned."""
    raw = json.dumps(list(position), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _invalid(response: httpx.Response, name: str) -> None:
    problem = assert_problem(response, 422, "validation_error")
    assert name in str(problem["errors"]), problem


@pytest.mark.parametrize("since", EXTREMES)
def test_since_at_the_extremes_with_an_offset_is_422(deployment: Deployment, since: str) -> None:
    _invalid(_list(deployment.a, since=since), "since")


def test_since_at_the_extremes_in_utc_is_answered(deployment: Deployment) -> None:
    for since in ("0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z"):
        response = _list(deployment.a, since=since, limit=1)
        assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "cursor",
    [
        "",  # was taken as no cursor
        _cursor("0001-01-01T00:00:00+00:00", str(uuid.uuid4())),  # year 1: was a 500
        _cursor("0001-01-01T00:00:00+14:00", str(uuid.uuid4())),
        _cursor("2026-11-26T12:00:00+00:00", "a\x00b"),  # NUL: was a 500 on Postgres
        _cursor("2026-11-26T12:00:00+00:00", str(uuid.uuid4())),  # well-formed: was accepted
        _cursor("2026-11-26T12:00:00+00:00", "' OR 1=1 --"),
        _cursor("2026-11-26T12:00:00+00:00", str(uuid.uuid4())) + ".AAAAAAAAAAAAAAAAAAAAAAAA",
        "a.b.c",
        ".",
    ],
    # Named, not by value: the random ids would differ in each pytest-xdist worker.
    ids=["empty", "year-1", "year-1+14h", "nul", "unknown", "quote", "signed", "a.b.c", "dot"],
)
def test_a_cursor_the_endpoint_did_not_return_is_422(deployment: Deployment, cursor: str) -> None:
    _invalid(_list(deployment.a, since="2026-11-20T00:00:00Z", cursor=cursor), "cursor")


def test_a_returned_cursor_works_once_bound_to_its_merchant_and_query(
    deployment: Deployment,
) -> None:
    terminal = f"T-C{uuid.uuid4().hex[:8]}"
    since = (datetime.now(UTC) - timedelta(seconds=5)).isoformat()
    keys = [new_key() for _ in range(3)]
    for key in keys:
        assert deployment.a.create(key, body(terminal_id=terminal)).status_code == 201
    first = _list(deployment.a, since=since, terminal_id=terminal, limit=1)
    assert first.status_code == 200, first.text
    cursor = first.json()["next_cursor"]
    assert isinstance(cursor, str)
    second = _list(deployment.a, since=since, terminal_id=terminal, limit=1, cursor=cursor)
    assert second.status_code == 200, second.text
    assert second.json()["data"][0]["id"] != first.json()["data"][0]["id"]
    # another merchant's, another terminal's, another since's: not this endpoint's cursor
    _invalid(_list(deployment.b, since=since, terminal_id=terminal, cursor=cursor), "cursor")
    _invalid(_list(deployment.a, since=since, cursor=cursor), "cursor")
    _invalid(_list(deployment.a, since=since, terminal_id=terminal + "x", cursor=cursor), "cursor")
    other_since = "2026-01-01T00:00:00Z"
    _invalid(_list(deployment.a, since=other_since, terminal_id=terminal, cursor=cursor), "cursor")
    # the same instant written with another offset is the same query
    offset = datetime.fromisoformat(since).astimezone(timezone(timedelta(hours=5))).isoformat()
    again = _list(deployment.a, since=offset, terminal_id=terminal, limit=1, cursor=cursor)
    assert again.status_code == 200 and again.json()["data"] == second.json()["data"]
    # a cursor edited by one character is refused
    edited = cursor[:-1] + ("A" if cursor[-1] != "A" else "B")
    _invalid(_list(deployment.a, since=since, terminal_id=terminal, cursor=edited), "cursor")


@pytest.mark.parametrize("field", ["captured_at", "expires_at"])
@pytest.mark.parametrize("moment", EXTREMES)
@pytest.mark.parametrize("advice", [False, True])
def test_create_timestamps_at_the_extremes_are_422_never_5xx(
    deployment: Deployment, field: str, moment: str, advice: bool
) -> None:
    payload = body(**{field: moment})
    if advice:
        captured = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
        payload = body(**{"entry_mode": "offline", "captured_at": captured, field: moment})
    key = new_key()
    problem = assert_problem(deployment.a.create(key, payload), 422, "validation_error")
    assert field in str(problem["errors"]), problem
    assert deployment.count("idempotency_key", key=key) == 0
