"""``idempay lake synth`` plants offline advices and the duplicate guard's blocks and
overrides (issues 16, 17); the audit finds exactly what was planted, in Spark and DuckDB."""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyspark.sql import SparkSession

from analytics import duckdb_reference
from analytics.jobs.daily_audit import audit_tables, collect
from analytics.synth import SynthConfig, SynthResult, synthesize

FIRST, DAYS = date(2026, 11, 20), 2
LAST = FIRST + timedelta(days=DAYS)  # the advices forwarded past the last midnight


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SynthResult]:
    root = tmp_path_factory.mktemp("offline-synth")
    config = SynthConfig(
        lake=root, days=DAYS, events_per_day=6000, seed=5, start=FIRST, merchants=2
    )
    return root, synthesize(config)


def _planted(result: SynthResult) -> dict[str, dict[str, Any]]:
    """The fleet's figures per day, from the planted sales alone."""
    days: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"offline": 0, "declined": 0, "at_risk": 0, "late": 0, "delays": [],
                 "blocked": 0, "overridden": 0}
    )  # fmt: skip
    for sale in result.planted_offline:
        day = days[sale.day.isoformat()]
        day["offline"] += 1
        day["declined"] += sale.declined
        day["at_risk"] += sale.amount if sale.declined else 0
        day["late"] += sale.forwarded_after_day_end
        day["delays"].append(sale.forward_delay_s)
    for blocked_on, _ in result.planted_blocks:
        days[blocked_on.isoformat()]["blocked"] += 1
    for overridden_on, _ in result.planted_overrides:
        days[overridden_on.isoformat()]["overridden"] += 1
    return dict(days)


def _check(offline: list[dict[str, Any]], guard: list[dict[str, Any]], result: SynthResult) -> None:
    planted = _planted(result)
    fleet = {r["event_date"]: r for r in offline if r["merchant_id"] == "ALL"}
    assert {r["currency"] for r in offline} == {"BRL"}
    for day, want in planted.items():
        got = fleet[day]
        assert (
            got["offline_transactions"],
            got["offline_declined"],
            got["offline_amount_at_risk"],
            got["forwarded_after_day_end"],
        ) == (want["offline"], want["declined"], want["at_risk"], want["late"]), day
        delays = np.array(want["delays"])
        assert got["forward_delay_max_s"] == delays.max()
        assert math.isclose(got["forward_delay_p50_s"], np.percentile(delays, 50), rel_tol=1e-9)
        assert math.isclose(got["forward_delay_p95_s"], np.percentile(delays, 95), rel_tol=1e-9)
        assert math.isclose(got["offline_rate"], want["offline"] / got["transactions"])
    assert set(fleet) == set(planted)  # no offline transaction that was not planted
    blocks = {r["event_date"]: r for r in guard if r["merchant_id"] == "ALL"}
    for day, want in planted.items():
        assert (blocks[day]["duplicates_blocked"], blocks[day]["duplicates_overridden"]) == (
            want["blocked"],
            want["overridden"],
        ), day


def test_synth_plants_offline_sales_and_guard_decisions(
    synthesized: tuple[Path, SynthResult],
) -> None:
    _, result = synthesized
    planted = _planted(result)
    assert sorted(planted) == [(FIRST + timedelta(days=i)).isoformat() for i in range(DAYS + 1)]
    everything = result.planted_offline
    assert len(everything) > 50 and any(s.declined for s in everything)
    assert any(s.forwarded_after_day_end for s in everything)
    assert result.planted_blocks and result.planted_overrides
    assert len(result.planted_overrides) < len(result.planted_blocks)
    overrides = {key for _, key in result.planted_overrides}  # also real double charges
    assert overrides <= {second for _, _, second in result.planted_double_charges}


def test_the_audit_finds_what_was_planted_in_spark(
    spark: SparkSession, synthesized: tuple[Path, SynthResult]
) -> None:
    root, result = synthesized
    tables = audit_tables(spark, lake=str(root), start=FIRST, end=LAST)
    offline, guard = collect(tables["offline_summary"]), collect(tables["duplicate_guard"])
    _check(offline, guard, result)
    answers = duckdb_reference.audit(root, start=FIRST, end=LAST, threads=1)
    _check(answers["offline_summary"], answers["duplicate_guard"], result)
    for name, rows in (("offline_summary", offline), ("duplicate_guard", guard)):
        assert len(answers[name]) == len(rows)
        for theirs, ours in zip(answers[name], rows, strict=True):
            for column, value in ours.items():
                if isinstance(value, float):
                    assert math.isclose(theirs[column], value, rel_tol=1e-9), (name, column)
                else:
                    assert theirs[column] == value, (name, column)
