"""Acquirer clearing files for the tests, in the format of contract §2.9, written by hand."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from idempay_tools.cli import app

HEADER = [
    "record_type",
    "rrn",
    "stan",
    "merchant_id",
    "terminal_id",
    "processing_code",
    "amount",
    "currency",
    "authorization_code",
    "approved_at",
    "reversed_at",
    "record_count",
    "net_amount",
]
PURCHASE, REFUND = "000000", "200000"


def d_row(
    rrn: str,
    approved_at: str,
    amount: int,
    *,
    merchant: str = "mer_a",
    terminal: str = "T-1",
    code: str = PURCHASE,
    currency: str = "BRL",
    reversed_at: str = "",
) -> list[str]:
    """A ``D`` row; times as '2026-11-20 10:00:00' (UTC)."""

    def iso(moment: str) -> str:
        return moment.replace(" ", "T") + ".000000+00:00" if moment else ""

    return [
        "D",
        rrn,
        "000001",
        merchant,
        terminal,
        code,
        str(amount),
        currency,
        "A1B2C3",
        iso(approved_at),
        iso(reversed_at),
        "",
        "",
    ]


def write_clearing_file(
    path: Path, rows: list[list[str]], *, count: int | None = None, net: int | None = None
) -> Path:
    """``rows`` and their trailer (count and net computed here unless given: a lying
    trailer)."""
    if count is None:
        count = len(rows)
    if net is None:
        net = sum((-1 if r[5].startswith("20") else 1) * int(r[6]) for r in rows if not r[10])
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(HEADER)
        writer.writerows(rows)
        writer.writerow(["T", *[""] * 10, str(count), str(net)])
    return path


def add_clearing(path: Path, lake: Path, *extra: str) -> Any:
    """``idempay lake add-clearing PATH --lake LAKE [extra]``; the CliRunner's result."""
    return CliRunner().invoke(app, ["lake", "add-clearing", str(path), "--lake", str(lake), *extra])
