"""What the raw-HTTP scenarios share: the API key, payloads, headers and response checks."""

from __future__ import annotations

import os
import random
import uuid
from typing import Any

from locust.contrib.fasthttp import ResponseContextManager

PROCESSED = frozenset({"approved", "declined"})
CREATE = "POST /v1/transactions"
LOOKUP = "GET /v1/transactions/{id}"
LINK_FAULT = " [link fault]"


def api_key() -> str:
    key = os.environ.get("IDEMPAY_API_KEY", "")
    if not key:
        raise RuntimeError("set IDEMPAY_API_KEY to an API key of the server under test")
    return key


def new_key() -> str:
    return str(uuid.uuid4())


def payment(terminal_id: str, rng: random.Random) -> dict[str, Any]:
    last4 = rng.choice(("4242", "1881", "0077", "5556"))
    return {
        "terminal_id": terminal_id,
        "amount": rng.randint(100, 50_000),
        "currency": "BRL",
        "card": {"token": f"tok_visa_{last4}", "last4": last4, "brand": "visa"},
    }


def create_headers(token: str, key: str, attempt: int) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Idempotency-Key": key,
        "Idempotency-Attempt": str(attempt),
        "POS-Network": "gprs",
    }


def retry_after(resp: ResponseContextManager, default: float = 0.5, cap: float = 5.0) -> float:
    try:
        return min(cap, max(0.0, float(resp.headers.get("Retry-After", default))))
    except (TypeError, ValueError):
        return default


def is_link_fault(resp: ResponseContextManager) -> bool:
    """No HTTP answer at all (connection dropped/reset/timed out): the request is in doubt.
    Reported as a success under its own ``[link fault]`` row: the lossy link is expected;
    what the scenario checks is how the terminal resolves it."""
    if resp.status_code:
        return False
    resp.request_meta["name"] = resp.request_meta["name"] + LINK_FAULT
    resp.success()
    return True


def is_processing(resp: ResponseContextManager, key: str) -> bool:
    """A 202 ``processing`` for ``key``: the acquirer had not answered within the server's
    ``IDEMPAY_ANSWER_WITHIN`` and the server finishes the key itself (contract: a create or
    a lookup may answer so under load)."""
    if resp.status_code != 202:
        return False
    try:
        body = resp.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("id") == key and body.get("status") == "processing"


def check_transaction(resp: ResponseContextManager, key: str) -> bool:
    """A 200/201 body is the transaction stored under ``key``; a replay says so."""
    try:
        body = resp.json()
    except ValueError:
        resp.failure(f"{resp.status_code}: body is not JSON")
        return False
    if not isinstance(body, dict) or body.get("id") != key:
        got = body.get("id") if isinstance(body, dict) else body
        resp.failure(f"{resp.status_code}: id {got!r} != {key}")
        return False
    if body.get("status") not in PROCESSED:
        resp.failure(f"{resp.status_code}: status {body.get('status')!r}")
        return False
    status = resp.headers.get("Idempotency-Status")
    replayed = resp.headers.get("Idempotent-Replayed")
    if resp.status_code == 201 and status == "replayed" and replayed != "true":
        resp.failure("replay without Idempotent-Replayed: true")
        return False
    if resp.status_code == 201 and replayed is not None and replayed != "true":
        resp.failure(f"Idempotent-Replayed: {replayed!r}")
        return False
    resp.success()
    return True
