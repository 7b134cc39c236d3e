"""API key guessing is rate limited per client address (IDEMPAY_AUTH_FAILURE_LIMIT), and no
failure tells a malformed, unknown or revoked key apart (docs/security.md)."""

from __future__ import annotations

import secrets

import httpx

from api.auth import hash_key
from tests.api.security.conftest import Audited, KeptApi, stable_headers
from tests.support.backend import Backend
from tests.support.client import assert_problem, new_key
from tests.support.eventually import eventually

LIMIT = 8
SERVER_ENV = {"IDEMPAY_AUTH_FAILURE_LIMIT": f"{LIMIT}/minute"}
ATTACKER = "203.0.113.7"  # behind the trusted proxy (127.0.0.1): X-Forwarded-For counts
NEIGHBOUR = "198.51.100.9"


def _guess() -> str:
    return "idp_" + secrets.token_urlsafe(32)


def _get(api: KeptApi, authorization: str | None, client: str) -> httpx.Response:
    headers = {"X-Forwarded-For": client}
    if authorization is not None:
        headers["Authorization"] = authorization
    return api.client().get(f"/v1/transactions/{new_key()}", headers=headers)


def test_failures_look_alike_and_are_limited_per_address(audited: Audited) -> None:
    api, backend = audited.api, audited.backend
    known = api.api_key  # a terminal of a known merchant behind the attacker's NAT
    assert (
        api.client()
        .get(
            f"/v1/transactions/{new_key()}",
            headers={**api.headers(None), "X-Forwarded-For": ATTACKER},
        )
        .status_code
        == 404
    )
    unused = backend.api_key("merchant-guessing-new")  # valid, never used on this server
    revoked = backend.api_key("merchant-guessing-revoked")
    backend.sql(
        "UPDATE api_key SET revoked_at = CURRENT_TIMESTAMP WHERE key_hash = :h", h=hash_key(revoked)
    )
    attempts = [
        None,
        "",
        "Bearer",
        "Basic dXNlcjpwYXNz",
        "Bearer " + "x" * 500,
        f"Bearer {_guess()}",
        f"Bearer {revoked}",
        f"Bearer {known[:-1]}",  # one character off a real key
    ]
    assert len(attempts) == LIMIT
    failures = [_get(api, attempt, ATTACKER) for attempt in attempts]
    for response in failures:
        assert_problem(response, 401, "unauthorized")
    assert len({r.content for r in failures}) == 1  # identical bodies …
    assert len({tuple(sorted(stable_headers(r).items())) for r in failures}) == 1  # … headers

    # over the limit: 429 for every guess, malformed or not, without checking the key
    for attempt in (f"Bearer {_guess()}", None, f"Bearer {revoked}"):
        limited = _get(api, attempt, ATTACKER)
        assert_problem(limited, 429, "rate_limited")
        assert 1 <= int(limited.headers["retry-after"]) <= 60
    # creates, aborts and reversals from that address are limited the same way
    for method, path in (("POST", ""), ("POST", f"/{new_key()}/abort")):
        response = api.client().request(
            method,
            f"/v1/transactions{path}",
            headers={"Authorization": f"Bearer {_guess()}", "X-Forwarded-For": ATTACKER},
        )
        assert_problem(response, 429, "rate_limited")

    # the known merchant's terminals behind the same address keep working
    created = api.client().post(
        "/v1/transactions",
        json={
            "terminal_id": "T-NAT",
            "amount": 990,
            "currency": "BRL",
            "card": {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"},
        },
        headers={**api.headers(new_key()), "X-Forwarded-For": ATTACKER},
    )
    assert created.status_code == 201, created.text
    # so does a key this process never saw succeed (a new merchant): a valid key always works
    assert _get(api, f"Bearer {unused}", ATTACKER).status_code == 404
    # other addresses are not affected: their failures are 401, their keys work
    assert_problem(_get(api, f"Bearer {_guess()}", NEIGHBOUR), 401, "unauthorized")
    assert _get(api, f"Bearer {unused}", NEIGHBOUR).status_code == 404


def test_the_block_lifts_by_itself_once_failures_stop(pg_backend: Backend) -> None:
    """Not locked out for good: a window after the last failure, the address is clear."""
    server = pg_backend.server(IDEMPAY_AUTH_FAILURE_LIMIT="3 per 2 seconds")
    api = KeptApi(server.url, pg_backend.api_key("merchant-guessing-lift"))
    try:
        for _ in range(3):
            assert_problem(_get(api, f"Bearer {_guess()}", ATTACKER), 401, "unauthorized")
        assert_problem(_get(api, f"Bearer {_guess()}", ATTACKER), 429, "rate_limited")
        response = eventually(
            lambda: _get(api, f"Bearer {_guess()}", ATTACKER),
            until=lambda answer: answer.status_code != 429,
            what="the block on the address to lift by itself (a 2 s window)",
            timeout=6,
        )
        assert_problem(response, 401, "unauthorized")
    finally:
        api.close()
        server.stop()
