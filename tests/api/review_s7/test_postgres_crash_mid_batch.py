"""Review s7 (Postgres group commit): Postgres crashes (``pg_ctl stop -m immediate``, a
private cluster) and restarts while terminals create through batches.

Contract §2/§3.1/§3.3: while storage is down a create is answered 503
``service_unavailable`` (problem+json, ``Retry-After``), never a 500; nothing is half
written (a key row without its transaction, a transaction without its ledger entry); nothing
acknowledged (201) is lost; a retry of a 5xx with the same key gets the real outcome — the
replay of a create that committed after all, or the create processed now — once.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest

from idempay_tools.private_services import PrivatePostgres
from tests.support.backend import Backend
from tests.support.client import body

pytestmark = pytest.mark.server

CLIENTS = 16


def test_postgres_crash_mid_batch(tmp_path: Path) -> None:
    # The cluster lives outside pytest's base temp dir: another pytest session on the machine
    # sets that back to 0700, and the postgres user then cannot reopen its files on recovery.
    root = Path(tempfile.mkdtemp(prefix="idempay-s7-pg-"))
    root.chmod(0o711)
    pg = PrivatePostgres(root).init()
    pg.start()
    backend = Backend("postgres", pg.url, tmp_path)
    try:
        backend.migrate()
        server = backend.server(IDEMPAY_DB_TIMEOUT="1")
        api_key = backend.api_key("review-s7-crash")
        sent: dict[str, int] = {}
        answers: list[tuple[str, int, str, bool]] = []  # key, status, content type, replayed

        async def run() -> None:
            stop = asyncio.Event()
            limits = httpx.Limits(max_connections=CLIENTS)
            async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as client:

                async def post(key: str) -> httpx.Response:
                    return await client.post(
                        "/v1/transactions",
                        json=body(amount=sent[key]),
                        headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": key},
                    )

                async def terminal(n: int) -> None:
                    while not stop.is_set():
                        key = str(uuid.uuid4())
                        sent[key] = 1000 + len(sent)
                        r = await post(key)
                        answers.append(
                            (key, r.status_code, r.headers.get("content-type", ""), False)
                        )
                        if r.status_code >= 500:
                            await asyncio.sleep(0.05)

                tasks = [asyncio.create_task(terminal(n)) for n in range(CLIENTS)]
                await asyncio.sleep(1.5)
                await asyncio.to_thread(pg.crash)
                await asyncio.sleep(1.0)
                await asyncio.to_thread(pg.start)
                await asyncio.sleep(3.0)
                stop.set()
                await asyncio.gather(*tasks)
                # retry every create answered 5xx with its key until it gets a real answer
                deadline = time.monotonic() + 20
                for key, status, _, _ in list(answers):
                    if status < 500:
                        continue
                    while True:
                        r = await post(key)
                        if r.status_code < 500 or time.monotonic() > deadline:
                            break
                        await asyncio.sleep(0.2)
                    replayed = r.headers.get("Idempotent-Replayed") == "true"
                    answers.append(
                        (key, r.status_code, r.headers.get("content-type", ""), replayed)
                    )

        asyncio.run(run())
        statuses = sorted({status for _, status, _, _ in answers})
        unavailable = [a for a in answers if a[1] == 503]
        print("statuses", statuses, "creates", len(sent), "503s", len(unavailable))
        print("replays after 5xx", sum(1 for a in answers if a[3]))
        assert unavailable, "the crash was not seen: no create was answered 503"
        assert set(statuses) <= {201, 503}, [a for a in answers if a[1] not in (201, 503)][:5]
        assert all(a[2].startswith("application/problem+json") for a in unavailable)
        last = {key: status for key, status, _, _ in answers}
        assert all(status == 201 for status in last.values()), "a 5xx was never settled"
        rows = backend.sql(
            'SELECT k.key, k.state, (SELECT count(*) FROM "transaction" t WHERE t.id = k.key),'
            " (SELECT count(*) FROM ledger_entry l WHERE l.transaction_id = k.key),"
            " (SELECT count(*) FROM issuer_authorization)"
            " FROM idempotency_key k"
        )
        assert {r[0] for r in rows} == set(sent)
        assert all((r[1], r[2], r[3]) == ("completed", 1, 1) for r in rows)
        assert rows[0][4] == len(sent)
        assert backend.sql('SELECT count(*) FROM "transaction"')[0][0] == len(sent)
    finally:
        backend.stop_all()
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)
