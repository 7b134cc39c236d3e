"""contract §3.3: a server killed with SIGKILL while creates pour in has every create it
acknowledged (201) in the database, whole — and no create half-written: a key is completed
with its transaction, its charge and its event, or still only claimed (its 0200 in doubt,
for recovery to settle) with nothing else."""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp

from api.acquirer.host.store import summary
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

    completed = (
        "SELECT key FROM idempotency_key WHERE state = 'completed' AND terminal_id = 'T-KILL'"
    )
    keys = _ids(backend, completed)
    assert set(acknowledged) <= keys  # nothing acknowledged is lost
    # every completed key is whole; a key still claimed has nothing else
    assert _ids(backend, "SELECT id FROM \"transaction\" WHERE terminal_id = 'T-KILL'") == keys
    in_keys = "transaction_id IN (SELECT key FROM idempotency_key WHERE terminal_id = 'T-KILL')"
    approved = _ids(
        backend,
        "SELECT id FROM \"transaction\" WHERE terminal_id = 'T-KILL' AND status = 'approved'",
    )  # all but a 0200 settled in doubt before the kill (declined, no charge)
    assert _ids(backend, f"SELECT transaction_id FROM ledger_entry WHERE {in_keys}") == approved
    assert _ids(backend, f"SELECT transaction_id FROM outbox_event WHERE {in_keys}") == keys
    charges = backend.sql(f"SELECT count(*) FROM ledger_entry WHERE {in_keys}")[0][0]
    assert charges == len(approved)  # one charge each
    # every approval recorded is the acquirer's approval of the key's one 0200
    rrns = backend.sql(
        "SELECT rrn FROM \"transaction\" WHERE terminal_id = 'T-KILL' AND status = 'approved'"
    )
    seen = summary(backend.tmp / "var" / "acquirer.sqlite3")
    assert {(seen[rrn].requests, seen[rrn].approved) for (rrn,) in rrns} == {(1, True)}
