"""Review s6, finding 1: the issuer's legacy-record adoption gated by a cached look (3789935).
Each test failed on that code and passes since 4c454d8, which sends the adoption on every
call again (the tests now guard against the gate's return).

``SimulatedIssuer._adopt`` sends its adoption (and a void its second UPDATE for a ``''``
record beside the merchant's) only while its last ``SELECT EXISTS (... merchant_id = '')``
said yes, asked at most every ``legacy_recheck_s`` (10 s). Its docstring reasons that the
window is harmless because it "stays under the default 15 s lease". But the terminal's
abort takes over a key within the *issuer timeout + 0.5 s* of its claim
(``resolution._abort_may_take_over``: 5.5 s by default, lease still live), and the lease
itself is any positive number (``lease_seconds``, gt=0).

The rolling update, as it looks here: a new replica (a real ``idempay serve``) has just
looked (a reversal's void) and found no ``''`` record; an old replica (pre-7c2ea99,
emulated with the rows it writes: the key's claim and its issuer record under merchant
``''``) claims a ``tok_issuer_timeout`` payment and records its first issuer call, which
does not answer. The terminal gives up and its abort reaches the new replica:

* default settings: the abort takes the key over 5.5 s after its claim, fences it and voids
  — a ``voided`` record of its own under the merchant; the old replica's ``approved``
  authorization stays standing. The terminal is told "aborted, never processed" while the
  issuer holds an approved authorization nobody will ever void.
* ``IDEMPAY_LEASE_SECONDS=5`` (a legal setting) and a long deadline: the completer re-drives
  the key after the lease, inserts a new record (calls 1) beside the old one — a second
  authorization at the issuer for one payment.
* default settings, the 202 path: the old replica's issuer call does not answer within the
  issuer timeout, it answers 202 and hands its lease over at once (``_hand_over``); the new
  replica's completer re-drives 5–6 s after the '' record was written — a second
  authorization at the issuer (the lease never protected this path).
* a reversal (any settings): the old replica approved the payment, the customer's reversal
  reaches the new replica a moment later; the transaction is reversed, the issuer's
  approval is never voided.

Before 3789935 the adoption ran on every call and both held (the tests in
``tests/api/migrations_review``); they fail on 3789935.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.config import Settings
from api.db import atomic, create_engine, utcnow
from api.idempotency import store
from api.idempotency.keys import body_fingerprint
from api.transactions.issuer import derive_issuer_key
from api.transactions.schemas import TransactionCreate
from tests.support.backend import Backend
from tests.support.client import Api, body, card
from tests.support.eventually import eventually
from tests.support.services import create_database, drop_database, pg_url

pytestmark = pytest.mark.server

SECRET = Settings.model_fields["secret_key"].default
RECHECK_S = 10.0  # api.transactions.issuer.LEGACY_RECHECK_S, the default


@pytest.fixture(params=["postgres", "sqlite"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    name = create_database("review_s6_legacy") if request.param == "postgres" else None
    backend = Backend(request.param, pg_url(name) if name else None, tmp_path)
    try:
        backend.settings.var_dir.mkdir(parents=True, exist_ok=True)
        backend.migrate()  # at head: 0012 ran, no '' record stored
        yield backend
    finally:
        backend.stop_all()
        if name:
            drop_database(name)


def merchant_id_of(backend: Backend, name: str) -> str:
    return str(backend.sql("SELECT id FROM merchant WHERE name = :n", n=name)[0][0])


def old_replica_claims(backend: Backend, merchant_id: str, key: str, *, lease_s: float) -> None:
    """What a pre-7c2ea99 replica leaves for a tok_issuer_timeout payment it is driving: the
    key claimed now (its lease live), and its first issuer call recorded under merchant ''
    (approved, calls 1: that call never answers, the next would)."""
    payment = TransactionCreate.model_validate(body(card=card("tok_issuer_timeout")))

    async def claim() -> None:
        engine = create_engine(backend.settings)
        try:
            async with atomic(engine) as conn:
                assert await store.claim(
                    conn,
                    merchant_id=merchant_id,
                    key=key,
                    fingerprint=body_fingerprint(payment),
                    request=payment.stored_request(),
                    terminal_id=payment.terminal_id,
                    now=utcnow(),
                    lease_s=lease_s,
                    deadline_s=3600.0,
                )
        finally:
            await engine.dispose()

    asyncio.run(claim())
    backend.sql(
        "INSERT INTO issuer_authorization (merchant_id, issuer_key, result, authorization_code,"
        " amount, currency, calls, created_at, voided_at) VALUES ('', :k, 'approved', 'A1B2C3',"
        " :amount, 'BRL', 1, :t, NULL)",
        k=derive_issuer_key(SECRET, merchant_id, key),
        amount=payment.amount,
        t=utcnow(),
    )


def issuer_rows(backend: Backend, merchant_id: str, key: str) -> list[tuple[str, str, int, bool]]:
    rows = backend.sql(
        "SELECT merchant_id, result, calls, voided_at IS NOT NULL FROM issuer_authorization"
        " WHERE issuer_key = :k ORDER BY merchant_id",
        k=derive_issuer_key(SECRET, merchant_id, key),
    )
    return [(str(m), str(r), int(c), bool(v)) for m, r, c, v in rows]


def first_look(api: Api) -> float:
    """Make the new replica's issuer look for '' records now (a reversal voids): none."""
    key = str(uuid.uuid4())
    created = api.create(key)
    assert created.status_code == 201, created.text
    looked = time.monotonic()
    reversed_ = api.reverse(key)
    assert reversed_.status_code == 200 and reversed_.json()["status"] == "reversed"
    return looked


def test_an_abort_voids_the_authorization_an_old_replica_recorded_just_after_the_look(
    backend: Backend,
) -> None:
    # Default timings for what matters here: issuer timeout 5 s, lease 15 s, deadline 60 s.
    server = backend.server(
        IDEMPAY_ISSUER_TIMEOUT="5",
        IDEMPAY_LEASE_SECONDS="15",
        IDEMPAY_ISSUER_DEADLINE="60",
    )
    api = Api(server.url, backend.api_key("review-s6"))
    merchant = merchant_id_of(backend, "review-s6")
    looked = first_look(api)

    key = str(uuid.uuid4())
    old_replica_claims(backend, merchant, key, lease_s=15.0)
    # The terminal gives up: its abort may take the key over 5.5 s after the claim.
    time.sleep(5.7)
    aborted = api.abort(key)
    assert time.monotonic() - looked < RECHECK_S  # within the window, by construction
    assert aborted.status_code == 200, aborted.text
    assert aborted.json()["status"] == "aborted"  # "never processed, never will be"

    rows = issuer_rows(backend, merchant, key)
    standing = [r for r in rows if r[1] == "approved" and not r[3]]
    assert standing == [], f"an authorization left standing under an aborted key: {rows}"


def test_a_re_drive_never_authorizes_twice_with_a_short_lease(backend: Backend) -> None:
    server = backend.server(
        IDEMPAY_ISSUER_TIMEOUT="1.5",
        IDEMPAY_LEASE_SECONDS="4",
        IDEMPAY_ISSUER_DEADLINE="3600",
        IDEMPAY_COMPLETER_INTERVAL="0.3",
    )
    api = Api(server.url, backend.api_key("review-s6"))
    merchant = merchant_id_of(backend, "review-s6")
    first_look(api)

    key = str(uuid.uuid4())
    old_replica_claims(backend, merchant, key, lease_s=4.0)  # the old replica then dies

    def state() -> str:
        return str(
            backend.sql(
                "SELECT state FROM idempotency_key WHERE merchant_id = :m AND key = :k",
                m=merchant,
                k=key,
            )[0][0]
        )

    # The completer re-drives after the lease (4 s), within the look's 10 s. With the old
    # record adopted, the re-drive is its call 2 and answers at once.
    eventually(state, what="the key re-driven to completion", until="completed".__eq__, timeout=30)
    rows = issuer_rows(backend, merchant, key)
    # One record for the payment: the first authorization answered again, never a second one.
    assert len(rows) == 1, f"the issuer authorized one payment twice: {rows}"


def test_a_reversal_voids_the_approval_an_old_replica_recorded_just_after_the_look(
    backend: Backend,
) -> None:
    """The author's own example: an old replica approves a payment (one-write create: the key,
    the transaction, the charge and its issuer record under merchant ''), and the customer's
    reversal reaches the new replica a moment later. Emulated: the new replica processes the
    payment, then its issuer record is put back under '' — exactly what the old replica's
    create leaves (every other row is the same across the two versions)."""
    server = backend.server()
    api = Api(server.url, backend.api_key("review-s6"))
    merchant = merchant_id_of(backend, "review-s6")
    looked = first_look(api)

    key = str(uuid.uuid4())
    created = api.create(key)
    assert created.status_code == 201 and created.json()["status"] == "approved"
    issuer_key = derive_issuer_key(SECRET, merchant, key)
    backend.sql(
        "UPDATE issuer_authorization SET merchant_id = '' WHERE merchant_id = :m"
        " AND issuer_key = :k",
        m=merchant,
        k=issuer_key,
    )
    reversed_ = api.reverse(key)
    assert time.monotonic() - looked < RECHECK_S  # within the window, by construction
    assert reversed_.status_code == 200 and reversed_.json()["status"] == "reversed"

    rows = issuer_rows(backend, merchant, key)
    standing = [r for r in rows if r[1] == "approved" and not r[3]]
    assert standing == [], f"a reversed payment's authorization left standing: {rows}"


def old_replica_hands_over(backend: Backend, merchant_id: str, key: str) -> None:
    """The old replica's 202: its issuer call did not answer within the issuer timeout, so it
    expires its lease now (``TransactionService._hand_over``, unchanged since the foundation)
    for the completer fleet — a new replica's among it — to re-drive the key."""

    async def release() -> None:
        engine = create_engine(backend.settings)
        try:
            async with atomic(engine) as conn:
                await store.release(conn, merchant_id=merchant_id, key=key, token=1, until=utcnow())
        finally:
            await engine.dispose()

    asyncio.run(release())


def test_a_key_an_old_replica_answered_202_is_never_authorized_twice(backend: Backend) -> None:
    """No short lease needed: the 202 path releases the lease at once, so the re-drive comes
    issuer timeout (5 s) + one completer tick (1 s) after the old replica's record — inside
    the 10 s the issuer believes "no '' record is stored"."""
    server = backend.server(
        IDEMPAY_ISSUER_TIMEOUT="5",
        IDEMPAY_LEASE_SECONDS="15",
        IDEMPAY_ISSUER_DEADLINE="60",
        IDEMPAY_COMPLETER_INTERVAL="1",
    )
    api = Api(server.url, backend.api_key("review-s6"))
    merchant = merchant_id_of(backend, "review-s6")
    first_look(api)

    key = str(uuid.uuid4())
    old_replica_claims(backend, merchant, key, lease_s=15.0)
    time.sleep(5.0)  # the old replica's issuer timeout: it answers 202 and hands over
    old_replica_hands_over(backend, merchant, key)

    def state() -> str:
        return str(
            backend.sql(
                "SELECT state FROM idempotency_key WHERE merchant_id = :m AND key = :k",
                m=merchant,
                k=key,
            )[0][0]
        )

    eventually(state, what="the key re-driven to completion", until="completed".__eq__, timeout=40)
    rows = issuer_rows(backend, merchant, key)
    assert len(rows) == 1, f"the issuer authorized one payment twice: {rows}"
