"""contract §3.3 on the one-write create (Postgres' single statement, SQLite's group commit):
a server killed with SIGKILL while creates pour in has every create it acknowledged (201)
in the database, whole — and no create half-written."""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp

from tests.support.backend import Backend
from tests.support.client import body, new_key

WORKERS = 40


async def _pour(url: str, api_key: str, acknowledged: list[str], stop: threading.Event) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    timeout = aiohttp.ClientTimeout(total=30)
    connector = aiohttp.TCPConnector(limit=WORKERS)
    async with aiohttp.ClientSession(
        url, headers=headers, timeout=timeout, connector=connector
    ) as client:

        async def worker() -> None:
            while not stop.is_set():
                key = new_key()
                try:
                    async with client.post(
                        "/v1/transactions",
                        json=body(terminal_id="T-KILL"),
                        headers={"Idempotency-Key": key},
                    ) as response:
                        await response.read()
                        if response.status == 201:
                            acknowledged.append(key)
                except (aiohttp.ClientError, TimeoutError):
                    return  # the server is gone: this create is in doubt, not acknowledged

        await asyncio.gather(*(worker() for _ in range(WORKERS)))


def _ids(backend: Backend, statement: str) -> set[str]:
    return {str(row[0]) for row in backend.sql(statement)}


def test_every_acknowledged_create_survives_sigkill(private_backend: Backend) -> None:
    backend = private_backend
    server = backend.server()
    api_key = backend.api_key(f"merchant-kill-{backend.name}")
    acknowledged: list[str] = []
    stop = threading.Event()
    pouring = threading.Thread(
        target=asyncio.run, args=(_pour(server.url, api_key, acknowledged, stop),)
    )
    pouring.start()
    deadline = time.monotonic() + 60
    while len(acknowledged) < 300 and time.monotonic() < deadline:
        time.sleep(0.02)
    server.kill()  # SIGKILL with creates in flight, some batches mid-commit
    stop.set()
    pouring.join(60)
    assert len(acknowledged) >= 300

    keys = _ids(backend, "SELECT key FROM idempotency_key WHERE terminal_id = 'T-KILL'")
    assert set(acknowledged) <= keys  # nothing acknowledged is lost
    completed = (
        "SELECT key FROM idempotency_key WHERE state = 'completed' AND terminal_id = 'T-KILL'"
    )
    assert _ids(backend, completed) == keys  # every key written is whole:
    assert _ids(backend, "SELECT id FROM \"transaction\" WHERE terminal_id = 'T-KILL'") == keys
    in_keys = "transaction_id IN (SELECT key FROM idempotency_key WHERE terminal_id = 'T-KILL')"
    assert _ids(backend, f"SELECT transaction_id FROM ledger_entry WHERE {in_keys}") == keys
    assert _ids(backend, f"SELECT transaction_id FROM outbox_event WHERE {in_keys}") == keys
    charges = backend.sql(f"SELECT count(*) FROM ledger_entry WHERE {in_keys}")[0][0]
    assert charges == len(keys)  # one charge each
    issuer = backend.sql("SELECT count(*) FROM issuer_authorization")[0][0]
    assert issuer == len(keys)  # this private database has only these payments
