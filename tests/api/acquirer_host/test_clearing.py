"""``idempay acquirer clearing``: a D row per approval of the day, the T trailer's count
and net amount (refunds negative, reversals excluded), and a reader that refuses a file
whose trailer disagrees."""

from __future__ import annotations

import csv
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

import pytest

from api.acquirer.host.clearing import COLUMNS, ClearingFileError, read_clearing
from api.acquirer.host.store import summary
from tests.api.acquirer_host.conftest import Wire, auth_request, reversal_of, start_host
from tests.support.services import ROOT

IDEMPAY = Path(sys.executable).parent / "idempay"


@pytest.fixture(scope="module")
def day_of_sales(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, date, dict[str, str]]:
    """A store with purchases and refunds, approved, declined and reversed; the day."""
    proc = start_host(tmp_path_factory.mktemp("clearing"))
    wire = Wire(proc.port)
    sales = {
        "purchase": auth_request(amount=1000),
        "reversed purchase": auth_request(amount=2000),
        "refund": auth_request(amount=300, kind="refund"),
        "reversed refund": auth_request(amount=700, kind="refund"),
        "declined": auth_request("tok_decline_insufficient_funds", amount=500),
        "advised first": auth_request(amount=900),
    }
    wire.reverse(reversal_of(sales["advised first"]), advice=True)
    wire.answer()
    for req in sales.values():
        wire.call(req)
    for name in ("reversed purchase", "reversed refund"):
        wire.reverse(reversal_of(sales[name]), advice=True)
        wire.answer()
    proc.stop()
    approved = [row.approved_at for row in summary(proc.store).values() if row.approved_at]
    days = {date.fromisoformat(at[:10]) for at in approved}
    assert len(days) == 1, "the sales straddled midnight UTC; run again"
    return proc.store, days.pop(), {name: req.rrn for name, req in sales.items()}


def _clearing(store: Path, day: date, out: Path, *, via: str = "module") -> str:
    entry = (
        [str(IDEMPAY), "acquirer"]
        if via == "idempay"
        else [sys.executable, "-m", "api.acquirer.host"]
    )
    done = subprocess.run(
        [*entry, "clearing", "--store", str(store), "--date", day.isoformat(), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_clearing_file_rows_and_trailer(
    day_of_sales: tuple[Path, date, dict[str, str]], tmp_path: Path
) -> None:
    store, day, rrns = day_of_sales
    out = tmp_path / "clearing.csv"
    printed = _clearing(store, day, out, via="idempay")
    assert "4 records, net amount 700" in printed
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == list(COLUMNS)
    details, trailer = rows[:-1], rows[-1]
    by_rrn = {r["rrn"]: r for r in details}
    names = ("purchase", "reversed purchase", "refund", "reversed refund")
    assert set(by_rrn) == {rrns[n] for n in names}
    assert all(
        r["record_type"] == "D" and r["record_count"] == r["net_amount"] == "" for r in details
    )
    assert by_rrn[rrns["refund"]]["processing_code"] == "200000"
    assert by_rrn[rrns["purchase"]]["reversed_at"] == ""
    assert by_rrn[rrns["reversed refund"]]["reversed_at"] != ""
    purchase = by_rrn[rrns["purchase"]]
    assert (purchase["merchant_id"], purchase["terminal_id"]) == ("merchant-a", "T-0001")
    assert (purchase["amount"], purchase["currency"]) == ("1000", "BRL")
    assert trailer["record_type"] == "T"
    assert (trailer["record_count"], trailer["net_amount"]) == ("4", "700")  # 1000 − 300
    assert all(trailer[c] == "" for c in COLUMNS[1:11])
    clearing = read_clearing(out)
    assert (clearing.record_count, clearing.net_amount) == (4, 700)


def test_a_day_without_approvals_has_only_a_zero_trailer(
    day_of_sales: tuple[Path, date, dict[str, str]], tmp_path: Path
) -> None:
    store, day, _ = day_of_sales
    out = tmp_path / "empty.csv"
    _clearing(store, day - timedelta(days=1), out)
    clearing = read_clearing(out)
    assert (clearing.records, clearing.record_count, clearing.net_amount) == ((), 0, 0)
    assert [p.name for p in tmp_path.iterdir()] == ["empty.csv"]  # no temp file left


@pytest.fixture(scope="module")
def day_file(
    day_of_sales: tuple[Path, date, dict[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> list[str]:
    """The day's clearing file as the host writes it (its lines), read back whole: the file
    each tampering test edits."""
    store, day, _ = day_of_sales
    out = tmp_path_factory.mktemp("day-file") / "clearing.csv"
    _clearing(store, day, out)
    assert read_clearing(out).record_count == 4
    return out.read_text().splitlines()


def _tamper(lines: list[str], how: str) -> list[str]:
    if how == "amount edited":
        cells = lines[1].split(",")
        cells[6] = str(int(cells[6]) + 1)
        return [lines[0], ",".join(cells), *lines[2:]]
    if how == "row deleted":
        return [lines[0], *lines[2:]]
    if how == "truncated":
        return lines[:-1]
    if how == "row after trailer":
        return [*lines, lines[1]]
    if how == "trailer count edited":
        return [*lines[:-1], lines[-1].replace(",4,", ",5,")]
    if how == "no header":
        return lines[1:]
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    [
        "amount edited",
        "row deleted",
        "truncated",
        "row after trailer",
        "trailer count edited",
        "no header",
    ],
)
def test_read_clearing_refuses_a_tampered_file(
    day_file: list[str], tmp_path: Path, how: str
) -> None:
    out = tmp_path / "clearing.csv"
    out.write_text("\n".join(_tamper(day_file, how)) + "\n")
    with pytest.raises(ClearingFileError):
        read_clearing(out)


def test_clearing_without_a_store_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "api.acquirer.host",
            "clearing",
            "--store",
            str(tmp_path / "none.sqlite3"),
            "--date",
            "2026-11-20",
            "--out",
            str(tmp_path / "x.csv"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "no acquirer store" in done.stderr
