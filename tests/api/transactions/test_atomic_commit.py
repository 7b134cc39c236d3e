"""contract §3.1 ("row 8" of the guarantees): the key, the money and the stored response commit
in one database transaction, or none of them do.

The create's commit is made to fail at its very end by the database itself — on Postgres a
deferred constraint trigger that raises at COMMIT, after every statement of the create has
run; on SQLite (no deferred triggers) a trigger that fails the last statement, the outbox
insert. Nothing of the create may remain: the key is free, and there is no transaction, no
ledger entry, no issuer record and no outbox event. The retry then processes it, once.
"""

from __future__ import annotations

from tests.support.backend import Backend
from tests.support.client import Api, assert_problem, new_key

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


def _remains(backend: Backend, key: str) -> dict[str, int]:
    counts = {}
    for table, column in (
        ("idempotency_key", "key"),
        ("transaction", "id"),
        ("ledger_entry", "transaction_id"),
        ("outbox_event", "transaction_id"),
    ):
        rows = backend.sql(f'SELECT count(*) FROM "{table}" WHERE {column} = :k', k=key)
        counts[table] = int(rows[0][0])
    # the issuer key is derived from the key: this private database has only this payment
    counts["issuer_authorization"] = int(
        backend.sql("SELECT count(*) FROM issuer_authorization")[0][0]
    )
    return counts


def test_a_create_whose_commit_fails_at_the_end_leaves_nothing(private_backend: Backend) -> None:
    backend = private_backend
    server = backend.server()
    api = Api(server.url, backend.api_key("merchant-row-8"))
    key = new_key()
    fault = _POSTGRES_FAULT if backend.name == "postgres" else _SQLITE_FAULT
    for statement in fault:
        backend.sql(statement)
    try:
        failed = api.create(key)
        assert failed.status_code >= 500, failed.text
        assert _remains(backend, key) == dict.fromkeys(
            ("idempotency_key", "transaction", "ledger_entry", "outbox_event",
             "issuer_authorization"), 0,
        )  # fmt: skip
        assert_problem(api.lookup(key), 404, "not_found")  # the key is free

        backend.sql(
            "DROP TRIGGER fail_at_commit" + (" ON outbox_event" if fault is _POSTGRES_FAULT else "")
        )
        retry = api.create(key)
        assert retry.status_code == 201 and retry.headers["idempotency-status"] == "created"
        assert _remains(backend, key) == dict.fromkeys(
            ("idempotency_key", "transaction", "ledger_entry", "outbox_event",
             "issuer_authorization"), 1,
        )  # fmt: skip
    finally:
        server.stop()
