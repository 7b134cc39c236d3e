"""issuer records: the legacy ``''`` rows get their merchant (review of 0008, issue 18)

Migration 0008 named the merchant of every issuer record stored until then. Code that predates
7c2ea99 kept writing ``issuer_authorization.merchant_id = ''`` (the column's default) after
0008 had run — the shipped a038ec9 among it — while 0008's backfilled rows, and every row the
current code writes, name the real merchant. The simulator finds its record by (merchant_id,
issuer_key), so one side missed the other's record: a key in flight across the upgrade was
authorized a second time on re-drive (two approved rows for one issuer key, and later passes
failed with MultipleResultsFound), or its void wrote a fresh ``voided`` row under the other
merchant and left the approved one unvoided.

This revision re-homes the ``''`` rows, whatever the history:

1. every key row, in keyset batches on the primary key ``(merchant_id, key)``, yields its
   issuer key, ``HMAC(IDEMPAY_SECRET_KEY, "<merchant>:<key>")`` (frozen below, as in 0008);
   a ``''`` row with that issuer key belongs to that merchant;
2. without a record under the merchant it moves there as it is (approved beats absent);
3. with one, the two are merged into the merchant's row and the ``''`` row goes. The simulator
   is one issuer honouring one idempotency key, so the merged record is what that issuer
   would hold had it seen both calls under one key:

   - **voided if either is** — a void is final in the simulator (an authorize after a void
     answers the void), and the key whose void wrote a row was fenced: its authorization must
     not stand. ``voided_at`` is the later of the two voids (the one that voided the rows
     that were still approved), the time the last authorization under the key was cancelled;
   - otherwise **approved if either is** (an approval is never lost to a row that has none),
     else declined;
   - ``authorization_code`` / ``decline_reason``: the row that has one (both rows derive the
     code from the same issuer key, so two codes are equal); ``amount``/``currency`` from
     the approved row if any;
   - ``calls``: the sum (every call the issuer received), ``created_at``: the earlier.

Rows whose key row is gone (a purged tombstone's void) keep ``''``: nothing looks them up.
Rows written with ``''`` after this revision (an older replica still serving during the
rolling update) are found by the simulator's legacy tolerance on plain Postgres and SQLite
(api/transactions/issuer.py). Rows are moved by INSERT + DELETE, never by updating
``merchant_id``: Citus refuses to change a distribution column. Idempotent (a second run finds
no ``''`` row to move); row locks only, no table lock.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 22:00:00
"""

import hashlib
import hmac
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 5_000
COLUMNS = (
    "merchant_id",
    "issuer_key",
    "result",
    "decline_reason",
    "authorization_code",
    "amount",
    "currency",
    "calls",
    "created_at",
    "voided_at",
)


def _issuer_key(secret: str, merchant_id: str, key: str) -> str:
    """``api.transactions.issuer.derive_issuer_key`` as of this revision (frozen here)."""
    message = f"{merchant_id}:{key}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()[:40]


def _later(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return a if b is None else b
    return max(a, b)


def _earlier(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return a if b is None else b
    return min(a, b)


def merge(own: dict[str, Any], legacy: dict[str, Any]) -> dict[str, Any]:
    """The merchant's record and the ``''`` one for the same issuer key, as one record."""
    results = {own["result"], legacy["result"]}
    approved = [r for r in (own, legacy) if r["result"] == "approved" or r["authorization_code"]]
    first = approved[0] if approved else own
    merged = dict(own)
    if "voided" in results:
        merged["result"] = "voided"
        merged["voided_at"] = _later(own["voided_at"], legacy["voided_at"])
    elif "approved" in results:
        merged["result"] = "approved"
    merged["authorization_code"] = own["authorization_code"] or legacy["authorization_code"]
    merged["decline_reason"] = own["decline_reason"] or legacy["decline_reason"]
    merged["amount"], merged["currency"] = first["amount"], first["currency"]
    merged["calls"] = int(own["calls"] or 0) + int(legacy["calls"] or 0)
    merged["created_at"] = _earlier(own["created_at"], legacy["created_at"])
    return merged


def _rows(bind: sa.Connection, merchant_id: str, issuer_keys: list[str]) -> dict[str, Any]:
    found = bind.execute(
        sa.text(
            f"SELECT {', '.join(COLUMNS)} FROM issuer_authorization "
            "WHERE merchant_id = :m AND issuer_key IN :keys"
        ).bindparams(sa.bindparam("keys", expanding=True)),
        {"m": merchant_id, "keys": issuer_keys},
    )
    return {str(row.issuer_key): dict(row._mapping) for row in found}


def rehome(bind: sa.Connection, secret: str, batch: int = BATCH) -> dict[str, int]:
    """Move or merge every ``''`` record a key row names; returns what it did."""
    done = {"moved": 0, "merged": 0}
    if not bind.execute(
        sa.text("SELECT 1 FROM issuer_authorization WHERE merchant_id = '' LIMIT 1")
    ).first():
        return done
    insert = sa.text(
        f"INSERT INTO issuer_authorization ({', '.join(COLUMNS)}) "
        f"VALUES ({', '.join(':' + c for c in COLUMNS)})"
    )
    change = sa.text(
        "UPDATE issuer_authorization SET "
        + ", ".join(f"{c} = :{c}" for c in COLUMNS[2:])
        + " WHERE merchant_id = :merchant_id AND issuer_key = :issuer_key"
    )
    drop = sa.text("DELETE FROM issuer_authorization WHERE merchant_id = '' AND issuer_key = :k")
    last: tuple[str, str] | None = None
    while True:
        if last is None:
            page = bind.execute(
                sa.text(
                    "SELECT merchant_id, key FROM idempotency_key "
                    "ORDER BY merchant_id, key LIMIT :n"
                ),
                {"n": batch},
            ).all()
        else:  # a row comparison: one index range scan per batch (0008's OR was a full scan)
            page = bind.execute(
                sa.text(
                    "SELECT merchant_id, key FROM idempotency_key "
                    "WHERE (merchant_id, key) > (:m, :k) ORDER BY merchant_id, key LIMIT :n"
                ),
                {"m": last[0], "k": last[1], "n": batch},
            ).all()
        if not page:
            return done
        last = (str(page[-1][0]), str(page[-1][1]))
        owner = {_issuer_key(secret, str(m), str(k)): str(m) for m, k in page if m}
        legacy = _rows(bind, "", list(owner))
        if not legacy:
            continue
        by_merchant: dict[str, list[str]] = {}
        for issuer_key in legacy:
            by_merchant.setdefault(owner[issuer_key], []).append(issuer_key)
        inserts: list[dict[str, Any]] = []
        updates: list[dict[str, Any]] = []
        for merchant_id, keys in by_merchant.items():
            own = _rows(bind, merchant_id, keys)
            for issuer_key in keys:
                old = legacy[issuer_key]
                if issuer_key in own:
                    updates.append(merge(own[issuer_key], old))
                else:
                    inserts.append({**old, "merchant_id": merchant_id})
        bind.execute(drop, [{"k": k} for k in legacy])
        if inserts:
            bind.execute(insert, inserts)
        if updates:
            bind.execute(change, updates)
        done["moved"] += len(inserts)
        done["merged"] += len(updates)


def upgrade() -> None:
    from api.config import Settings  # the secret the servers derive issuer keys with

    rehome(op.get_bind(), Settings().secret_key)


def downgrade() -> None:
    """Nothing to undo: a record under its merchant is what every version since 0008 reads
    (the pre-7c2ea99 code looked records up by issuer key alone)."""
