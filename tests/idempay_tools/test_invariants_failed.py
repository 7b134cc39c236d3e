"""``InvariantReport.failed()`` names every failing invariant: the built-in ones and those a
run added (``idempay simulate``'s settlement checks) — the CLI's "invariants failed:" line
is built from it."""

from __future__ import annotations

from idempay_tools.invariants import INVARIANTS, InvariantReport


def _report(failures: dict[str, int]) -> InvariantReport:
    return InvariantReport(
        merchant_ids=("m",), reported=1, transactions=1, charges=1, aborted_keys=0,
        processing_keys=0, journal_entries=1, journal_open=0, duplicates=0, lost=0,
        ledger=(), failures=failures,
    )  # fmt: skip


def test_an_added_invariant_that_fails_is_named() -> None:
    first = INVARIANTS[0]
    report = _report({first: 1, "settlement_exceptions": 2, "settlement_matched": 0})
    assert not report.ok
    assert report.failed() == [first, "settlement_exceptions"]


def test_nothing_failing_names_nothing() -> None:
    assert _report({"settlement_exceptions": 0}).failed() == []
