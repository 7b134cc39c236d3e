"""What every create answer must mean on the claim → 0200 → finish path, checked after the
fact against the lookup, the database and the simulated acquirer host's own store.

Contract §2 (the status table), §2.9 (one 0200 per key; in doubt → declined /
acquirer_timeout with a 0420 queued), §3.1–3.3 and §8. For each answer:

- 201: the transaction; the lookup shows the same body (created or replayed alike);
- 202: the server finishes the key by itself: it ends terminal and the lookup is 200;
- 409 ``request_in_progress``: a retry with the same key and body gets the real outcome
  (the replay, or the create processed now — or 422 if another body owns the key);
- 422 ``idempotency_key_reused``: another body owns the key (the lookup shows it);
- 503: nothing was processed: the key is absent from the database and the acquirer never
  saw its RRN (checked before anything retries it);
- no answer at all (connection closed): the lookup is 200 or 404, never stuck;

and, over all keys: none is still ``processing`` once the lease has run out; every
completed key has one transaction, and a charge/refund ledger entry exactly when approved;
the acquirer received at most one 0200 per key, agrees with every decided transaction, and
once the reversal-advice queue has drained its net approvals are exactly the approved
transactions, by RRN.

Helpers for tests/api/transactions and tests/api/shutdown; the backend must be private to
the test (its acquirer store, ``<tmp>/var/acquirer.sqlite3``, holds only its keys).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from api.acquirer.host.store import net_approvals, summary
from api.acquirer.messages import rrn_for
from tests.support.backend import Backend
from tests.support.eventually import eventually
from tests.support.services import Server

PROBLEM = "application/problem+json"
SETTLE_S = 60.0  # the leases of the fast settings run out in 6 s; the machine is shared
ADVICES_S = 120.0  # an advice that met the acquirer down backs off (1, 2, 4, … s)


@dataclass
class Sent:
    """One create and what came back (a response, or the error of a request left
    unanswered)."""

    merchant_id: str
    api_key: str
    key: str
    payload: dict[str, Any]
    answer: httpx.Response | BaseException

    @property
    def status(self) -> int | None:
        return self.answer.status_code if isinstance(self.answer, httpx.Response) else None

    @property
    def response(self) -> httpx.Response:
        assert isinstance(self.answer, httpx.Response), self.answer
        return self.answer

    @property
    def ident(self) -> tuple[str, str]:
        return self.merchant_id, self.key


def merchant_id(backend: Backend, name: str) -> str:
    return str(backend.sql("SELECT id FROM merchant WHERE name = :n", n=name)[0][0])


def new_merchant(backend: Backend, name: str) -> tuple[str, str]:
    """A new merchant ``name`` of the backend's: (its API key, its id)."""
    api_key = backend.api_key(name)
    return api_key, merchant_id(backend, name)


def acquirer_store(backend: Backend) -> Path:
    return backend.tmp / "var" / "acquirer.sqlite3"


def rrn(backend: Backend, merchant: str, key: str) -> str:
    return rrn_for(backend.settings.secret_key.encode(), merchant, key)


def _headers(api_key: str, key: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {api_key}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return headers


def _describe(sent: Sent) -> str:
    answer = sent.answer
    text = answer.text[:300] if isinstance(answer, httpx.Response) else repr(answer)
    return f"{sent.key} ({sent.payload.get('amount')}): {sent.status} {text}"


def assert_shape(sent: Sent, allowed: set[int]) -> None:
    """The answer is one the contract has for this situation, with its headers."""
    r = sent.response
    assert r.status_code in allowed, _describe(sent)
    status = r.headers.get("Idempotency-Status")
    if r.status_code == 201:
        assert status in ("created", "replayed"), _describe(sent)
        assert (r.headers.get("Idempotent-Replayed") == "true") == (status == "replayed")
        assert r.json()["id"] == sent.key and r.json()["status"] in ("approved", "declined")
        return
    if r.status_code == 202:
        assert r.json() == {"id": sent.key, "status": "processing"}, _describe(sent)
        assert status == "in_progress" and r.headers.get("Retry-After"), _describe(sent)
        return
    assert r.headers["content-type"].startswith(PROBLEM), _describe(sent)
    code = {409: "request_in_progress", 422: "idempotency_key_reused", 503: "service_unavailable"}
    assert r.json()["code"] == code[r.status_code], _describe(sent)
    if r.status_code in (409, 503):
        assert r.headers.get("Retry-After"), _describe(sent)
    expected = {409: "in_progress", 503: "not_found"}.get(r.status_code)
    if expected is not None:
        assert status == expected, _describe(sent)


def assert_not_stored(backend: Backend, refused: list[Sent]) -> None:
    """Every 503 told the truth: nothing under its key in the database (no key row, no
    transaction) and no message for its RRN at the acquirer. Run before any retry."""
    if not refused:
        return
    keys = {row[0]: row[1] for row in backend.sql("SELECT key, state FROM idempotency_key")}
    txns = {row[0] for row in backend.sql('SELECT id FROM "transaction"')}
    seen = summary(acquirer_store(backend))
    for sent in refused:
        assert sent.key not in keys, ("503 for a stored key", keys[sent.key], _describe(sent))
        assert sent.key not in txns, ("503 for a processed key", _describe(sent))
        assert rrn(backend, *sent.ident) not in seen, ("503, yet a 0200 left", _describe(sent))


def retry_until_real(url: str, sends: list[Sent], *, timeout: float = 60.0) -> dict[int, Sent]:
    """Retry each create answered 409 (or 503) with its key and body until the answer is the
    real outcome (201, or 422 for a key another body owns); a 202 is then awaited by lookup.
    Keyed by ``id(sent)`` of the original."""
    finals: dict[int, Sent] = {}
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=30) as client:
        for sent in sends:
            while True:
                r = client.post(
                    "/v1/transactions",
                    json=sent.payload,
                    headers=_headers(sent.api_key, sent.key),
                )
                if r.status_code not in (409, 503) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            retried = Sent(sent.merchant_id, sent.api_key, sent.key, sent.payload, r)
            assert_shape(retried, {201, 202, 422})
            finals[id(sent)] = retried
    return finals


def wait_settled(backend: Backend, *, timeout: float = SETTLE_S) -> None:
    """No key left ``processing``: each claim ended by its owner or, after its lease, by the
    completer (declined / acquirer_timeout with its advice queued)."""
    eventually(
        lambda: backend.sql("SELECT key FROM idempotency_key WHERE state = 'processing'"),
        until=lambda stuck: not stuck,
        what="every claimed key settled",
        timeout=timeout,
        interval=0.3,
    )


def assert_retried_truthful(
    url: str, backend: Backend, sends: list[Sent], again: list[Sent]
) -> None:
    """Each create of ``again`` (answered 409, 503 or not at all) retried until it gets the
    real outcome; once every claimed key has settled, every answer of ``sends`` and of the
    retries is checked against the lookups (``assert_truthful``)."""
    finals = retry_until_real(url, again)
    wait_settled(backend)
    assert_truthful(url, sends, finals)


def assert_truthful_after_restart(backend: Backend, sends: list[Sent], again: list[Sent]) -> Server:
    """A server started again on the same database and acquirer store: ``again`` retried
    there and every answer checked (``assert_retried_truthful``), then the acquirer's record
    (``assert_acquirer``). The new server, running."""
    restarted = backend.server()
    assert_retried_truthful(restarted.url, backend, sends, again)
    assert_acquirer(backend, {s.ident for s in sends})
    return restarted


def lookups(url: str, sends: list[Sent]) -> dict[tuple[str, str], httpx.Response]:
    found: dict[tuple[str, str], httpx.Response] = {}
    with httpx.Client(base_url=url, timeout=30) as client:
        for sent in sends:
            if sent.ident not in found:
                found[sent.ident] = client.get(
                    f"/v1/transactions/{sent.key}", headers=_headers(sent.api_key)
                )
    return found


def _owns(payload: dict[str, Any], txn: dict[str, Any]) -> bool:
    """The stored transaction is this body's (what the fingerprint compares, as far as the
    body shows: amount, type, currency, terminal)."""
    return bool(
        txn["amount"] == payload["amount"]
        and txn["type"] == payload.get("type", "purchase")
        and txn["currency"] == payload["currency"]
        and txn["terminal_id"] == payload["terminal_id"]
    )


def assert_truthful(url: str, sends: list[Sent], finals: dict[int, Sent]) -> None:
    """Each answer against the lookup, once every key has settled (``wait_settled``)."""
    found = lookups(url, sends)
    for sent in sends:
        look = found[sent.ident]
        if sent.status is None:  # unanswered: processed or not, but never left in flight
            assert look.status_code in (200, 404), (look.text, _describe(sent))
            continue
        final = finals.get(id(sent), sent)
        if sent.status == 503 and final is sent:
            continue  # shown absent by assert_not_stored; nothing retried it
        assert look.status_code == 200, (look.text, _describe(sent))
        txn = look.json()
        assert txn["status"] in ("approved", "declined") and txn["id"] == sent.key
        if final.status == 201:
            assert final.response.json() == txn, (look.text, _describe(final))
            assert _owns(final.payload, txn), (look.text, _describe(final))
        elif final.status == 422:
            assert not _owns(final.payload, txn), (look.text, _describe(final))
        else:  # 202: the server finished it by itself
            assert final.status == 202, _describe(final)
            assert _owns(final.payload, txn), (look.text, _describe(final))


def assert_database(backend: Backend) -> list[tuple[Any, ...]]:
    """Nothing half written, nothing stuck: every key completed with one transaction, one
    ledger entry exactly when approved. Returns the transactions (merchant, id, status,
    decline_reason, rrn)."""
    rows = backend.sql(
        "SELECT k.merchant_id, k.key, k.state,"
        ' (SELECT count(*) FROM "transaction" t WHERE t.merchant_id = k.merchant_id'
        " AND t.id = k.key),"
        " (SELECT count(*) FROM ledger_entry l WHERE l.merchant_id = k.merchant_id"
        " AND l.transaction_id = k.key) FROM idempotency_key k"
    )
    txns = backend.sql('SELECT merchant_id, id, status, decline_reason, rrn FROM "transaction"')
    status = {(t[0], t[1]): t[2] for t in txns}
    for merchant, key, state, copies, ledger in rows:
        assert (state, copies) == ("completed", 1), (merchant, key, state, copies)
        assert ledger == (1 if status[(merchant, key)] == "approved" else 0), (key, ledger)
    assert len(txns) == len(rows)
    return txns


def assert_acquirer(
    backend: Backend, idents: set[tuple[str, str]], *, timeout: float = ADVICES_S
) -> None:
    """At most one 0200 per key; the acquirer agrees with every decided transaction; once
    the advice queue has drained (a server must be running), its net approvals are exactly
    the approved transactions. ``idents``: every (merchant, key) sent."""
    eventually(
        lambda: backend.sql("SELECT count(*) FROM acquirer_advice WHERE acknowledged_at IS NULL"),
        until=lambda rows: rows[0][0] == 0,
        what="the reversal-advice queue drained",
        timeout=timeout,
        interval=0.5,
    )
    txns = {(t[0], t[1]): t[2:] for t in assert_database(backend)}
    assert set(txns) <= idents  # nothing written that was not sent
    store = acquirer_store(backend)
    seen = summary(store)
    for merchant, key in idents:
        ref = rrn(backend, merchant, key)
        at_host = seen.get(ref)
        # requests: 0200s received. 0 with a row: only the 0420 of a key settled in doubt
        # whose 0200 never arrived ("an acquirer that never saw the original acknowledges
        # the advice too", §2.9)
        requests = 0 if at_host is None else at_host.requests
        assert requests <= 1, (key, at_host)
        if (merchant, key) not in txns:
            assert at_host is None, ("the acquirer knows a key with nothing stored", key, at_host)
            continue
        status, reason, stored_rrn = txns[(merchant, key)]
        assert stored_rrn == ref, key
        if status == "approved":
            assert at_host is not None and requests == 1, (key, at_host)
            assert at_host.approved and not at_host.reversed, (key, at_host)
        elif reason != "acquirer_timeout":  # the acquirer's own decline
            assert at_host is not None and requests == 1, (key, reason, at_host)
            assert at_host.state == "declined", (key, reason, at_host)
    approved = {t[2] for t in txns.values() if t[0] == "approved"}
    assert net_approvals(store) == approved


def response_summary(sends: list[Sent]) -> str:
    counts: dict[str, int] = {}
    for sent in sends:
        name = str(sent.status) if sent.status is not None else type(sent.answer).__name__
        counts[name] = counts.get(name, 0) + 1
    return json.dumps(dict(sorted(counts.items())))
