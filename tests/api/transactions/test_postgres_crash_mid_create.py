"""Postgres crashes (``pg_ctl stop -m immediate``, a private cluster) and restarts while
terminals create, each create a claim → one 0200 → finish (contract §2, §2.9, §3.1, §3.3).

A crash can meet a create in any phase, and each phase has its own truthful answer:
- before the claim was sent (no connection, the claim's statement never written): 503
  ``service_unavailable`` — the key is absent from the database and its RRN unknown to the
  acquirer;
- the claim's commit unseen (connection lost mid-statement): the key is read back — our
  own claim is driven, else 409 ``request_in_progress`` (the lookup tells), never a 503
  that may be false (DESIGN.md "unknown commit outcomes");
- the claim committed, the 0200 out, the finish unable to commit: 202 — the key stays
  claimed, its lease runs out and the completer settles it declined / acquirer_timeout with
  the reversal advice queued in the same commit (the acquirer's approval is then reversed).

So where the group-commit create answered only 201 or 503, 202 and 409 are now contract
answers, and "every key ends 201 approved with one ledger entry" no longer holds: a key
settled in doubt is a declined transaction without ledger entry. What still holds, and is
checked: every 503 is for a key with nothing stored and no 0200 sent; every 409, retried
with its key, gets the real outcome; every 202 ends terminal by itself; every 201 is what
the lookup shows; no key is left processing after its lease; nothing is half written; the
acquirer saw at most one 0200 per key and, once the advices are acknowledged, its net
approvals are exactly the approved transactions.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import pytest

from tests.api.transactions.truthful_answers import (
    Sent,
    assert_acquirer,
    assert_not_stored,
    assert_retried_truthful,
    assert_shape,
    new_merchant,
    response_summary,
    wait_settled,
)
from tests.support.client import body, post_create
from tests.support.private_cluster import private_cluster

pytestmark = pytest.mark.server

CLIENTS = 16


def test_postgres_crash_while_creating(tmp_path: Path) -> None:
    with private_cluster("idempay-pgcrash-", tmp_path) as (pg, backend):
        server = backend.server(IDEMPAY_DB_TIMEOUT="1")
        name = "pg-crash-creates"
        api_key, merchant = new_merchant(backend, name)
        sends: list[Sent] = []

        async def run() -> None:
            stop = asyncio.Event()
            limits = httpx.Limits(max_connections=CLIENTS)
            async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as client:

                async def terminal() -> None:
                    while not stop.is_set():
                        key = str(uuid.uuid4())
                        payload = body(amount=1000 + len(sends))
                        r = await post_create(client, api_key, key, payload)
                        sends.append(Sent(merchant, api_key, key, payload, r))
                        if r.status_code >= 500:
                            await asyncio.sleep(0.05)

                tasks = [asyncio.create_task(terminal()) for _ in range(CLIENTS)]
                await asyncio.sleep(1.5)
                await asyncio.to_thread(pg.crash)
                await asyncio.sleep(1.0)
                await asyncio.to_thread(pg.start)
                await asyncio.sleep(3.0)
                stop.set()
                await asyncio.gather(*tasks)

        asyncio.run(run())
        print("answers", response_summary(sends))
        for sent in sends:
            assert_shape(sent, {201, 202, 409, 503})
        assert any(s.status != 201 for s in sends), "the crash was not seen: every create 201"
        # every 503 first, before anything retries its key: nothing stored, nothing sent
        refused = [s for s in sends if s.status == 503]
        wait_settled(backend)
        assert_not_stored(backend, refused)
        # a retry of a 409 or a 503 with the same key gets the real outcome, processed once
        again = [s for s in sends if s.status in (409, 503)]
        assert_retried_truthful(server.url, backend, sends, again)
        idents = {s.ident for s in sends}
        stored = {(r[0], r[1]) for r in backend.sql('SELECT merchant_id, id FROM "transaction"')}
        assert stored == idents  # every key sent ends processed (after the retries), once
        assert_acquirer(backend, idents)
