"""``idempay export``: a real server's day in the lake, exactly contract §5's columns and types,
idempotent, and no card token anywhere. Runs on Postgres and on the embedded SQLite."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from api.acquirer.messages import rrn_for
from api.models import RequestEvent
from tests.support.backend import Backend
from tests.support.client import Api, body, card, new_key
from tests.support.eventually import eventually

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "tok_visa_4242"
DEV_SECRET = b"idempay-dev-secret-change-me"  # Settings.secret_key's default

# contract §5, written out: (column, Arrow type).
CONTRACT = {
    "request_events": [
        ("event_id", "string"),
        ("ts", "timestamp[us, tz=UTC]"),
        ("merchant_id", "string"),
        ("terminal_id", "string"),
        ("idempotency_key", "string"),
        ("endpoint", "string"),
        ("outcome", "string"),
        ("http_status", "int32"),
        ("attempt", "int32"),
        ("network", "string"),
        ("latency_ms", "double"),
    ],
    "transactions": [
        ("transaction_id", "string"),
        ("merchant_id", "string"),
        ("terminal_id", "string"),
        ("type", "string"),
        ("amount", "int64"),
        ("currency", "string"),
        ("card_fingerprint", "string"),
        ("status", "string"),
        ("created_at", "timestamp[us, tz=UTC]"),
        ("processed_at", "timestamp[us, tz=UTC]"),
        ("reversed_at", "timestamp[us, tz=UTC]"),
        # lake schema 2, after the contract's columns (contract §5.1: additive, not contract)
        ("offline", "bool"),
        ("captured_at", "timestamp[us, tz=UTC]"),
        ("duplicate_override", "bool"),
        # lake schema 3: the settlement reconciliation's inputs (contract §5.1)
        ("rrn", "string"),
        ("authorization_code", "string"),
        ("decline_reason", "string"),
    ],
    "ledger_entries": [
        ("entry_id", "string"),
        ("transaction_id", "string"),
        ("merchant_id", "string"),
        ("amount", "int64"),
        ("currency", "string"),
        ("kind", "string"),
        ("created_at", "timestamp[us, tz=UTC]"),
    ],
}


def _export(backend: Backend, day: date, lake: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "api", "export", "--date", day.isoformat(), "--lake", str(lake)],
        cwd=ROOT,
        env={**os.environ, **backend.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _read(lake: Path, table: str, day: date) -> pa.Table:
    return pq.read_table(lake / table / f"event_date={day.isoformat()}" / "part-0.parquet")


def _mine(table: pa.Table, merchants: set[str]) -> list[dict[str, Any]]:
    return [row for row in table.to_pylist() if row["merchant_id"] in merchants]


def _insert_event(backend: Backend, **values: Any) -> None:
    async def run() -> None:
        engine = create_async_engine(backend.url, poolclass=NullPool)
        try:
            async with engine.begin() as conn:
                await conn.execute(insert(RequestEvent).values(**values))
        finally:
            await engine.dispose()

    asyncio.run(run())


def _event_count(backend: Backend, merchant_ids: list[str]) -> int:
    rows = backend.sql(
        "SELECT count(*) FROM request_event WHERE merchant_id IN (:a, :b)",
        a=merchant_ids[0],
        b=merchant_ids[1],
    )
    return int(rows[0][0])


def test_export_writes_the_contract_idempotently_and_no_token(
    backend: Backend, tmp_path: Path
) -> None:
    server = backend.server()
    try:
        _export_round_trip(backend, server.url, tmp_path / "lake")
    finally:
        server.stop()


def _export_round_trip(backend: Backend, url: str, lake: Path) -> None:
    a = Api(url, backend.api_key(f"export-a-{backend.name}"))
    b = Api(url, backend.api_key(f"export-b-{backend.name}"))
    k1, k2, k3 = new_key(), new_key(), new_key()
    assert a.create(k1, **{"Idempotency-Attempt": "1", "POS-Network": "gprs"}).status_code == 201
    assert a.create(k1, **{"Idempotency-Attempt": "2", "POS-Network": "gprs"}).status_code == 201
    assert a.lookup(k1).status_code == 200
    assert a.lookup(k2).status_code == 404
    assert a.abort(k2).status_code == 200
    assert a.reverse(k1).status_code == 200
    declined = body(card=card("tok_decline_insufficient_funds"))
    assert a.create(k3, declined).status_code == 201
    assert a.create(k1, body(amount=999)).status_code == 422
    assert b.create(k1).status_code == 201  # merchant B, the same UUID
    names = [f"export-a-{backend.name}", f"export-b-{backend.name}"]
    ids = {
        name: backend.sql("SELECT id FROM merchant WHERE name = :n", n=name)[0][0] for name in names
    }
    merchant_a, merchant_b = ids[names[0]], ids[names[1]]
    eventually(
        lambda: _event_count(backend, [merchant_a, merchant_b]),
        until=lambda count: count == 9,
        what="the 9 request events of the requests above",
    )
    today = datetime.now(UTC).date()
    yesterday = today - timedelta(days=1)
    _insert_event(
        backend,
        event_id="00000000-0000-4000-8000-00000000beef",
        ts=datetime.combine(today, datetime.min.time(), tzinfo=UTC) - timedelta(microseconds=1),
        merchant_id=merchant_a,
        terminal_id="T-0001",
        idempotency_key=new_key(),
        endpoint="lookup",
        outcome="not_found",
        http_status=404,
        attempt=None,
        network=None,
        latency_ms=1.5,
    )

    out = _export(backend, today, lake)
    assert "request_events:" in out

    for table, columns in CONTRACT.items():
        schema = pq.read_schema(lake / table / f"event_date={today}" / "part-0.parquet")
        assert [(f.name, str(f.type)) for f in schema] == columns, table

    mine = {merchant_a, merchant_b}
    events = _mine(_read(lake, "request_events", today), mine)
    assert sorted(
        (e["merchant_id"] == merchant_b, e["endpoint"], e["outcome"], e["http_status"])
        for e in events
    ) == [
        (False, "abort", "aborted", 200),
        (False, "create", "created", 201),
        (False, "create", "created", 201),
        (False, "create", "key_reused", 422),
        (False, "create", "replayed", 201),
        (False, "lookup", "found", 200),
        (False, "lookup", "not_found", 404),
        (False, "reversal", "reversed", 200),
        (True, "create", "created", 201),
    ]
    assert all(e["ts"].tzinfo is not None and e["ts"].date() == today for e in events)
    retried = [e for e in events if e["outcome"] == "replayed"]
    assert (retried[0]["attempt"], retried[0]["network"]) == (2, "gprs")
    assert {e["idempotency_key"] for e in events if e["merchant_id"] == merchant_b} == {k1}

    transactions = _mine(_read(lake, "transactions", today), mine)
    fingerprint = hmac.new(DEV_SECRET, TOKEN.encode(), hashlib.sha256).hexdigest()
    assert sorted(
        (t["merchant_id"] == merchant_b, t["transaction_id"], t["status"], t["amount"])
        for t in transactions
    ) == sorted(
        [(False, k1, "reversed", 1250), (False, k3, "declined", 1250), (True, k1, "approved", 1250)]
    )
    assert all(t["reversed_at"] is not None for t in transactions if t["status"] == "reversed")
    assert [t["card_fingerprint"] for t in transactions if t["transaction_id"] == k1] == [
        fingerprint,
        fingerprint,
    ]
    # each row's retrieval reference is its (merchant, key)'s at the acquirer; an approval
    # keeps its code when reversed; a decline carries its reason and no code
    for t in transactions:
        assert t["rrn"] == rrn_for(DEV_SECRET, t["merchant_id"], t["transaction_id"]), t
        if t["status"] == "declined":
            assert (t["authorization_code"], t["decline_reason"]) == (None, "insufficient_funds")
        else:
            assert t["authorization_code"] and t["decline_reason"] is None, t
    entries = _mine(_read(lake, "ledger_entries", today), mine)
    assert sorted((e["merchant_id"] == merchant_b, e["kind"], e["amount"]) for e in entries) == [
        (False, "charge", 1250),
        (False, "reversal", -1250),
        (True, "charge", 1250),
    ]

    # No token, in any cell of any table.
    for table in CONTRACT:
        for row in _read(lake, table, today).to_pylist():
            assert not any(isinstance(v, str) and "tok_" in v for v in row.values()), row

    # Marked exported only what was written; the day before is its own partition.
    pending = backend.sql(
        "SELECT count(*) FROM request_event WHERE merchant_id IN (:a, :b) AND exported_at IS NULL",
        a=merchant_a,
        b=merchant_b,
    )
    assert int(pending[0][0]) == 1  # yesterday's, not exported yet
    assert (
        "00000000-0000-4000-8000-00000000beef"
        not in _read(lake, "request_events", today).column("event_id").to_pylist()
    )

    # Re-export: the same partitions, byte for byte in content, and nothing else on disk.
    before = {t: _read(lake, t, today) for t in CONTRACT}
    listing = sorted(p.relative_to(lake) for p in lake.rglob("*"))
    _export(backend, today, lake)
    assert sorted(p.relative_to(lake) for p in lake.rglob("*")) == listing
    for table, content in before.items():
        assert _read(lake, table, today).equals(content), table

    _export(backend, yesterday, lake)
    late = _read(lake, "request_events", yesterday).column("event_id").to_pylist()
    assert "00000000-0000-4000-8000-00000000beef" in late


def test_export_of_a_quiet_day_writes_empty_partitions(backend: Backend, tmp_path: Path) -> None:
    quiet = date(2001, 1, 1)
    lake = tmp_path / "lake"
    _export(backend, quiet, lake)
    for table, columns in CONTRACT.items():
        content = _read(lake, table, quiet)
        assert content.num_rows == 0
        assert [(f.name, str(f.type)) for f in content.schema] == columns
