"""On Citus: a claim whose COMMIT reached the merchant's worker, committed there, and whose
reply to the coordinator was lost — never answered 503; and a held key answered within the
claim's lock timeout, which reaches the worker.

On Citus a single-shard transaction is committed on the worker by the coordinator (1PC, in
its PRE_COMMIT callback). When the worker's answer to that COMMIT is lost (the worker's
backend ends after its commit record is durable: here a commit waiting for a synchronous
standby that is cut by ``pg_terminate_backend``, "the transaction has already committed
locally"), Citus 13.2 only WARNs about the worker and then raises a plain ERROR (SQLSTATE
XX000, "could not commit transaction for shard … on at least one active node") for the
client's COMMIT. ``storage_errors.citus_commit_unseen`` takes that ERROR for an unknown
outcome (it read as "rolled back" before, and the create was answered 503 "nothing was
processed" while the key's row was committed on the worker) (contract §2: 503 only when
nothing was processed; DESIGN.md, unknown commit outcomes: never 503 unless the key is read
back and shown absent).
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx

from tests.support.backend import Backend
from tests.support.citus import (
    CitusCluster,
    execute_sync,
    query,
    shard_node_port,
)
from tests.support.client import Api, body, new_key, post_create
from tests.support.stalls import held_key


def test_a_claim_committed_on_the_worker_whose_reply_is_lost_is_not_503(
    citus_db: Backend, citus: CitusCluster
) -> None:
    database = citus_db.url.rsplit("/", 1)[1]
    dsn = citus.coordinator.dsn(database)
    api_key = citus_db.api_key("reply-lost")  # reference tables: before any commit waits
    merchant_id = query(dsn, "SELECT id FROM merchant WHERE name = 'reply-lost'")[0][0]
    worker = citus.node_of_port(shard_node_port(dsn, "idempotency_key", merchant_id))
    server = citus_db.server(IDEMPAY_DB_TIMEOUT="10")  # started (and writing) before the stall
    api = Api(server.url, api_key)
    # On the merchant's worker every commit now waits for a standby that never comes: the
    # claim's COMMIT is durable there and then waits (cut below).
    execute_sync(worker.dsn(), "ALTER SYSTEM SET synchronous_standby_names = 'ghost'")
    execute_sync(worker.dsn(), "SELECT pg_reload_conf()")
    answers: list[httpx.Response] = []
    key = new_key()
    try:
        thread = threading.Thread(target=lambda: answers.append(api.create(key)))
        thread.start()
        cut: list[str] = []
        deadline = time.monotonic() + 60
        while thread.is_alive() and time.monotonic() < deadline:
            # each commit of this database waiting on the worker ends after it is durable
            # there: its reply to the coordinator is lost
            for row in query(
                worker.dsn(),
                "SELECT pid, query FROM pg_stat_activity "
                "WHERE datname = $1 AND wait_event = 'SyncRep'",
                database,
            ):
                execute_sync(worker.dsn(), "SELECT pg_terminate_backend($1::int)", row["pid"])
                cut.append(str(row["query"]))
            time.sleep(0.02)
        thread.join(5)
        print("cut on the worker:", cut)
        assert cut, "no commit waited on the worker"
    finally:
        execute_sync(worker.dsn(), "ALTER SYSTEM RESET synchronous_standby_names")
        execute_sync(worker.dsn(), "SELECT pg_reload_conf()")
    time.sleep(0.5)
    (answer,) = answers
    stored = query(
        dsn,
        "SELECT state, lease_token FROM idempotency_key WHERE merchant_id = $1 AND key = $2",
        merchant_id,
        key,
    )
    print("create:", answer.status_code, answer.text, "stored:", [dict(r) for r in stored])
    log = server.log_tail()
    print("server log:", [line for line in log.splitlines() if "storage_unavailable" in line])
    retry = api.create(key)  # the 503 said: retry with the same key
    print("retry:", retry.status_code, retry.headers.get("Idempotency-Status"), retry.text[:120])
    # the claim committed on the worker …
    assert stored, "the claim did not commit on the worker: the 503 would be true"
    # … so "nothing was processed" (503) is false: in flight (409/202), or its outcome
    assert answer.status_code != 503, (answer.status_code, answer.text, stored)


def test_a_held_key_on_citus_is_answered_while_held(citus_db: Backend, citus: CitusCluster) -> None:
    """The claim's ``SET LOCAL lock_timeout = '250ms'`` (CLAIM_LOCK_TIMEOUT) reaches the
    worker (``SET LOCAL citus.propagate_set_commands = 'local'`` first: Citus does not
    propagate SET by default), so a claim of a key whose row another transaction holds is
    answered 409 (``_claim_held``) as on Postgres (tests/api/transactions/test_held_keys.py)
    instead of waiting on the worker for the holder."""
    database = citus_db.url.rsplit("/", 1)[1]
    dsn = citus.coordinator.dsn(database)
    server = citus_db.server()
    api_key = citus_db.api_key("held-citus")
    merchant_id = query(dsn, "SELECT id FROM merchant WHERE name = 'held-citus'")[0][0]
    key = new_key()

    async def run() -> tuple[httpx.Response, bool]:
        async with (
            held_key(dsn, merchant_id, key) as holder,
            httpx.AsyncClient(base_url=server.url, timeout=60) as client,
        ):
            task = asyncio.ensure_future(post_create(client, api_key, key, body()))
            done, _ = await asyncio.wait({task}, timeout=20)  # a cap: PG answers in 0.25 s
            await holder.release()
            return await task, bool(done)

    response, answered_while_held = asyncio.run(run())
    print("create of a held key:", response.status_code, response.text, answered_while_held)
    assert answered_while_held, (response.status_code, response.text)
    assert response.status_code == 409, response.text
