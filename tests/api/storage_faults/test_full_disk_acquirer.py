"""A full disk under the embedded SQLite, told truthfully to the operator (SPEC §2
"Operations"; docs/operations.md, "The embedded SQLite: its WAL and a full disk").

While no checkpoint can finish every write is refused before it begins, but the database
still answers reads: replays and lookups of existing keys are answered. So ``GET /readyz``
must not say the database is unreachable (a 503 takes the server out of its load balancer,
and with it the lookups a terminal in doubt needs; docs/operations.md: "`/readyz` fails only
when the database is unreachable"): it answers 200 ``degraded`` with the disk named full.
And ``idempay admin acquirer-queue`` — what the operator watches until the reversal advices
drain — is a read: it must list the queue on a full disk, not fail.

What failed before: ``/readyz`` answered 503 "The database is unreachable" (its ``SELECT 1``
opened a write transaction, ``BEGIN IMMEDIATE``, which the full disk refuses) while a lookup
of the same key answered 200; ``idempay admin acquirer-queue`` ended in a traceback
(``no room for a checkpoint on the database's disk``) for the same reason.

The disk is a loop-mounted ext4 image holding the database only; the simulated acquirer
host's store stays off it (``IDEMPAY_VAR_DIR``), where the second test reads what the
acquirer got: a full disk between a key's claim and its 0210 (pinned here end to end, with
real processes; it held on the code it was written against)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from idempay_tools._chaos_diskfull import ENV, LoopDisk, _prepare
from idempay_tools.serve_process import ServerProcess
from tests.support.client import Api, body, card
from tests.support.services import ROOT

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(os.geteuid() != 0, reason="a loop mount needs root"),
]

BODY = body(terminal_id="T-FULL")


def test_readyz_and_the_advice_queue_tell_the_truth_on_a_full_disk(tmp_path: Path) -> None:
    with LoopDisk(tmp_path / "disk", 24) as disk:
        data = disk.mount / "data"
        data.mkdir()
        env = {
            **ENV,
            "IDEMPAY_DATABASE_URL": f"sqlite+aiosqlite:///{data / 'idempay.db'}",
            "IDEMPAY_VAR_DIR": str(tmp_path / "var"),  # the acquirer host's store: off the disk
        }
        api_key = _prepare(env)
        server = ServerProcess(env, tmp_path / "server.log", cwd=ROOT).start()
        try:
            url = server.url
            api = Api(url, api_key)
            first = str(uuid.uuid4())
            created = api.create(first, BODY)
            assert created.status_code == 201, created.text
            refused: list[str] = []  # new keys refused in a row, the disk filled before each
            deadline = time.monotonic() + 60
            while len(refused) < 3:  # the reserve goes first, then every new key is refused
                assert time.monotonic() < deadline, "the disk never filled"
                filler = disk.fill("filler")
                key = str(uuid.uuid4())
                answer = api.create(key, BODY)
                # 202: claimed, its finish refused (the completer settles it)
                assert answer.status_code in (201, 202, 503), answer.text
                refused = [*refused, key] if answer.status_code == 503 else []
            # the premise: reads are answered, writes refused
            looked_up = api.lookup(first)
            assert looked_up.status_code == 200, looked_up.text

            ready = httpx.get(f"{url}/readyz", timeout=10.0)
            assert ready.status_code == 200, ready.text  # the database answers
            assert ready.json()["status"] == "degraded"
            assert ready.json()["checks"]["database"] == "ok"
            assert ready.json()["checks"]["disk"] == "full"

            queue = subprocess.run(
                [sys.executable, "-m", "api", "admin", "acquirer-queue"],
                cwd=ROOT,
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert queue.returncode == 0, queue.stderr[-2000:]
            assert queue.stdout.startswith("queued 0"), queue.stdout

            filler.unlink()  # space freed: nothing else is done
            deadline = time.monotonic() + 30
            while (again := api.create(refused[0], BODY)).status_code == 503:
                assert time.monotonic() < deadline, "creates never came back"
                time.sleep(0.2)
            assert again.status_code == 201, again.text  # the 503 was not stored
            assert again.headers["idempotency-status"] == "created"
            ready = httpx.get(f"{url}/readyz", timeout=10.0)
            assert ready.status_code == 200
            assert ready.json()["status"] == "ok"
            assert "disk" not in ready.json()["checks"]
        finally:
            server.stop()


SLOW = body(terminal_id="T-FULL", card=card("tok_issuer_slow"))
SLOW_KEYS = 3
FREE_AT_START_MIB = 12  # under the 16 MiB the reserve needs: the full disk refuses at once


def _rows(database: Path, sql: str) -> list[tuple[object, ...]]:
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


def test_a_full_disk_between_the_claim_and_the_answer_charges_no_one(tmp_path: Path) -> None:
    """The disk fills while three claimed keys wait for their 0210 (``tok_issuer_slow``,
    ~2 s): their finishes are refused, so each create answers 202 (never a 5xx, never
    approved unrecorded), and the keys stay processing while the disk stays full past their
    leases. Once space is freed, with nothing else done, every key ends terminal on its own,
    a retry replays it, the acquirer got one 0200 per key, and once the advice queue drains
    its net approvals are idempay's approved transactions, one to one by RRN (SPEC §3.8)."""
    with LoopDisk(tmp_path / "disk", 48) as disk:
        data = disk.mount / "data"
        data.mkdir()
        database = data / "idempay.db"
        var = tmp_path / "var"  # the child acquirer host's store: off the disk
        env = {
            **ENV,
            "IDEMPAY_DATABASE_URL": f"sqlite+aiosqlite:///{database}",
            "IDEMPAY_VAR_DIR": str(var),
            "IDEMPAY_ACQUIRER_TIMEOUT": "4",
            "IDEMPAY_LEASE_SECONDS": "2",
            "IDEMPAY_COMPLETER_INTERVAL": "0.5",
            "IDEMPAY_ADVICE_INTERVAL": "0.5",
        }
        api_key = _prepare(env)
        disk.leave_free(FREE_AT_START_MIB)
        server = ServerProcess(env, tmp_path / "server.log", cwd=ROOT).start()
        try:
            api = Api(server.url, api_key)
            keys = [str(uuid.uuid4()) for _ in range(SLOW_KEYS)]
            with ThreadPoolExecutor(SLOW_KEYS) as pool:
                sent = [pool.submit(api.create, key, SLOW) for key in keys]
                time.sleep(0.7)  # claimed, their 0200s out, their 0210s ~1.3 s away
                filler = disk.fill("filler")
                first = [future.result() for future in sent]
            assert [answer.status_code for answer in first] == [202] * SLOW_KEYS, [
                answer.text for answer in first
            ]
            time.sleep(8)  # past acquirer_timeout + lease: the completer cannot write either
            for key in keys:
                looked_up = api.lookup(key)
                assert looked_up.status_code == 202, looked_up.text
            filler.unlink()  # space freed: nothing else is done
            deadline = time.monotonic() + 60
            settled: dict[str, dict[str, object]] = {}
            while len(settled) < SLOW_KEYS:
                assert time.monotonic() < deadline, f"keys left processing: {settled}"
                for key in keys:
                    answer = api.lookup(key)
                    assert answer.status_code in (200, 202), answer.text
                    if answer.status_code == 200:
                        settled[key] = answer.json()
                time.sleep(0.5)
            for key in keys:
                again = api.create(key, SLOW)
                assert again.status_code == 201, again.text
                assert again.headers["idempotency-status"] == "replayed"
                assert again.json() == settled[key]
            deadline = time.monotonic() + 60
            while _rows(database, "SELECT 1 FROM acquirer_advice WHERE acknowledged_at IS NULL"):
                assert time.monotonic() < deadline, "the reversal advices never drained"
                time.sleep(0.5)
        finally:
            server.stop()
        store = var / "acquirer.sqlite3"
        sent_0200 = _rows(
            store, "SELECT rrn, count(*) FROM message WHERE mti = '0200' GROUP BY rrn"
        )
        ours = {
            str(row[0]): str(row[1])
            for row in _rows(database, 'SELECT id, rrn FROM "transaction"')
            if row[0] in keys
        }
        assert set(ours) == set(keys)  # every key has its transaction
        assert {rrn: n for rrn, n in sent_0200 if rrn in ours.values()} == {
            rrn: 1 for rrn in ours.values()
        }  # one 0200 per key, no more
        approved_here = {
            str(row[0])
            for row in _rows(database, "SELECT rrn FROM \"transaction\" WHERE status = 'approved'")
        }
        approved_there = {
            str(row[0])
            for row in _rows(
                store,
                "SELECT rrn FROM authorization"
                " WHERE approved_at IS NOT NULL AND reversed_at IS NULL",
            )
        }
        assert approved_there == approved_here
        # the path taken: the acquirer approved each 0200, idempay could not record it, so
        # each key settled in doubt and its 0420 undid the approval
        assert {(body["status"], body["decline_reason"]) for body in settled.values()} == {
            ("declined", "acquirer_timeout")
        }
        reversed_there = _rows(
            store,
            "SELECT rrn FROM authorization WHERE approved_at IS NOT NULL"
            " AND reversed_at IS NOT NULL",
        )
        assert set(ours.values()) <= {str(row[0]) for row in reversed_there}
        unledgered = _rows(
            database,
            "SELECT id FROM \"transaction\" t WHERE status = 'approved' AND NOT EXISTS"
            " (SELECT 1 FROM ledger_entry l WHERE l.transaction_id = t.id)",
        )
        assert unledgered == []
        assert _rows(database, "PRAGMA integrity_check") == [("ok",)]
