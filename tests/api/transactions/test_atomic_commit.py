"""contract §3.1 ("row 8" of the guarantees): the key's settlement, the money and the stored
response commit in one database transaction, or none of them do.

Across the acquirer boundary the key's claim commits first (``processing``), then its one
0200 leaves, then the final write — the transaction, its ledger entry, the outbox event and
the key's stored response — commits. That final write is made to fail at its very end by the
database itself: on Postgres a deferred constraint trigger that raises at COMMIT, after every
statement of the write has run; on SQLite (no deferred triggers) a trigger that fails its
last statement, the outbox insert. Nothing of the final write may remain — no transaction, no
ledger entry, no outbox event, no stored response (the key still only claimed) — neither of
the create's write nor of the completer's in-doubt settlements tried while the fault stands.
Once the fault is gone the key settles as an answer we could not record must (§2.9): its 0200
is never sent again, the key ends declined / acquirer_timeout, and the acquirer's approval is
reversed by the advice queued with it.
"""

from __future__ import annotations

from api.acquirer.host.store import summary
from tests.support.backend import Backend
from tests.support.client import Api, new_key
from tests.support.eventually import eventually

_POSTGRES_FAULT = (
    "CREATE FUNCTION fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS "
    "'BEGIN RAISE EXCEPTION ''injected: the commit fails''; END'",
    "CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT ON outbox_event "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_at_commit()",
)
_SQLITE_FAULT = (
    "CREATE TRIGGER fail_at_commit BEFORE INSERT ON outbox_event "
    "BEGIN SELECT RAISE(ABORT, 'injected: the last statement fails'); END",
)
_TABLES = ("transaction", "ledger_entry", "outbox_event", "acquirer_advice")


def _remains(backend: Backend, key: str) -> dict[str, int]:
    counts = {}
    for table, column in (
        ("transaction", "id"),
        ("ledger_entry", "transaction_id"),
        ("outbox_event", "transaction_id"),
        ("acquirer_advice", "key"),
    ):
        rows = backend.sql(f'SELECT count(*) FROM "{table}" WHERE {column} = :k', k=key)
        counts[table] = int(rows[0][0])
    return counts


def _key(backend: Backend, key: str) -> tuple[str, int, int | None]:
    """(state, lease token, stored response status) of the key row."""
    rows = backend.sql(
        "SELECT state, lease_token, response_status FROM idempotency_key WHERE key = :k", k=key
    )
    assert len(rows) == 1, rows
    state, token, status = rows[0]
    return str(state), int(token), status


def test_a_final_write_whose_commit_fails_at_the_end_leaves_only_the_claim(
    private_backend: Backend,
) -> None:
    backend = private_backend
    server = backend.server()
    api = Api(server.url, backend.api_key("merchant-row-8"))
    key = new_key()
    fault = _POSTGRES_FAULT if backend.name == "postgres" else _SQLITE_FAULT
    for statement in fault:
        backend.sql(statement)
    try:
        failed = api.create(key)
        assert failed.status_code == 202, failed.text  # not stored: the key is in flight
        assert failed.json() == {"id": key, "status": "processing"}
        assert _key(backend, key) == ("processing", 1, None)
        assert _remains(backend, key) == dict.fromkeys(_TABLES, 0)
        assert api.lookup(key).status_code == 202
        # the lease (acquirer timeout + lease seconds) runs out and the completer takes the
        # key over to settle it in doubt; that write fails at its end too, and leaves nothing
        eventually(lambda: _key(backend, key)[1] >= 2, what="a take-over", timeout=60)
        assert _key(backend, key)[0] == "processing"
        assert _remains(backend, key) == dict.fromkeys(_TABLES, 0)

        backend.sql(
            "DROP TRIGGER fail_at_commit" + (" ON outbox_event" if fault is _POSTGRES_FAULT else "")
        )
        done = eventually(
            lambda: api.lookup(key), what="the settlement", until=lambda r: r.status_code == 200,
            timeout=60,
        )  # fmt: skip
        txn = done.json()
        assert (txn["status"], txn["decline_reason"]) == ("declined", "acquirer_timeout"), txn
        assert _key(backend, key)[0] == "completed"
        assert _remains(backend, key) == {
            "transaction": 1, "ledger_entry": 0, "outbox_event": 1, "acquirer_advice": 1,
        }  # fmt: skip
        retry = api.create(key)
        assert retry.status_code == 201 and retry.headers["idempotency-status"] == "replayed"
        assert retry.content == done.content
        acknowledged = "SELECT acknowledged_at FROM acquirer_advice WHERE key = :k"
        eventually(lambda: backend.sql(acknowledged, k=key)[0][0], what="the advice's 0430")
    finally:
        server.stop()
    rrn = backend.sql('SELECT rrn FROM "transaction" WHERE id = :k', k=key)[0][0]
    acquirer = summary(backend.tmp / "var" / "acquirer.sqlite3")[rrn]
    # one 0200, ever; the approval the server could not record is reversed
    assert (acquirer.requests, acquirer.approved, acquirer.reversed) == (1, True, True)
