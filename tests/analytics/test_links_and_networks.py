"""Link loss, the terminal ranking and the rates by network (contract §5) on a hand-built lake,
every value by hand, from Spark and from the DuckDB reference alike.

The lake (merchant A, 2026-11-20 = D1, unless said otherwise; att = the SDK's ``attempt``):

  key  terminal network  create events (outcome att)            retried  received unseen
  a1   T-1      gprs     created 1                              no       1        0
  a2   T-1      gprs     created 3; lookup found (gprs)         yes      1        2   in doubt
  a3   T-1      gprs     error 1, created 4                     yes      2        2
  a4   T-2      wifi     created 1, replayed 2                  yes      2        0
  a5   T-2      wifi*    created (no att, no network), replayed 2 on wifi
                                                                yes      1        1
  a6   T-2      gprs     created 1, key_reused 5 (not counted)  no       1        0
  a7   T-3**    gprs     lookup not_found (wifi, no terminal), created 2
                                                                yes      1        1   in doubt
  a8   T-3      gprs     error 3 only: not a transaction, counts nothing but its event
  a9   T-3      wifi     created 1, replayed 1 (max(0, 1 − 2) = 0)  yes  2        0
  a10  T-4 (B)  unknown  created 2 (no network)                 yes      1        1
  a11  T-1      gprs     created 2 at 23:59:59 | D2: replayed 3 on wifi
                                                                yes      2        1
  a12  (none)   gprs     created 1, no terminal on any event    no       1        0
  a13  T-5      gprs     created 3                              yes      1        2
  a14–a15 T-6, a16–a17 T-7, a18 T-0: wifi, created 1 each       no       1        0
  D2: a19 T-1 gprs created 1; a20 lookup not_found only (wifi): not a transaction.

  *  a key's network is its earliest create event's that carries one.
  ** a key's terminal is its earliest event's that carries one (any endpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from analytics import duckdb_reference, money, offline, outputs, transforms
from analytics.jobs.daily_audit import collect, run_audit
from analytics.metrics import LINK_LOSS_COLUMNS, NETWORK_COLUMNS, RANKING_COLUMNS
from tests.analytics.lakes import D1, D2, as_dicts, assert_rows_equal, ev, frame, write_lake

K = {f"a{n}": f"00000000-0000-4000-8000-{n:012d}" for n in range(1, 21)}
DAY1, DAY2 = "2026-11-20", "2026-11-21"


def _create(key: str, clock: str, outcome: str, attempt: int | None, **kw: Any) -> dict[str, Any]:
    day = DAY2 if kw.pop("day2", False) else DAY1
    return ev(K[key], f"{day} {clock}", "create", outcome, attempt=attempt, **kw)


def _events() -> list[dict[str, Any]]:
    t1: dict[str, Any] = {"terminal": "T-1"}
    t2: dict[str, Any] = {"terminal": "T-2"}
    t3: dict[str, Any] = {"terminal": "T-3"}
    wifi: dict[str, Any] = {"network": "wifi"}
    return [
        _create("a1", "10:00:00", "created", 1, **t1),
        _create("a2", "10:01:00", "created", 3, **t1),
        ev(K["a2"], f"{DAY1} 10:01:20", "lookup", "found", terminal="T-1"),
        _create("a3", "10:02:00", "error", 1, **t1),
        _create("a3", "10:02:05", "created", 4, **t1),
        _create("a4", "10:03:00", "created", 1, **t2, **wifi),
        _create("a4", "10:03:05", "replayed", 2, **t2, **wifi),
        _create("a5", "10:04:00", "created", None, **t2, network=None),
        _create("a5", "10:04:05", "replayed", 2, **t2, **wifi),
        _create("a6", "10:05:00", "created", 1, **t2),
        _create("a6", "10:05:30", "key_reused", 5, **t2),
        ev(K["a7"], f"{DAY1} 10:06:00", "lookup", "not_found", terminal=None, **wifi),
        _create("a7", "10:06:01", "created", 2, **t3),
        _create("a8", "10:07:00", "error", 3, **t3),
        _create("a9", "10:08:00", "created", 1, **t3, **wifi),
        _create("a9", "10:08:05", "replayed", 1, **t3, **wifi),
        _create("a10", "10:09:00", "created", 2, merchant="mer_b", terminal="T-4", network=None),
        _create("a11", "23:59:59", "created", 2, **t1),
        _create("a11", "00:00:01", "replayed", 3, day2=True, **t1, **wifi),
        _create("a12", "10:10:00", "created", 1, terminal=None),
        _create("a13", "10:11:00", "created", 3, terminal="T-5"),
        _create("a14", "10:12:00", "created", 1, terminal="T-6", **wifi),
        _create("a15", "10:12:01", "created", 1, terminal="T-6", **wifi),
        _create("a16", "10:13:00", "created", 1, terminal="T-7", **wifi),
        _create("a17", "10:13:01", "created", 1, terminal="T-7", **wifi),
        _create("a18", "10:14:00", "created", 1, terminal="T-0", **wifi),
        _create("a19", "09:00:00", "created", 1, day2=True, **t1),
        ev(K["a20"], f"{DAY2} 09:30:00", "lookup", "not_found", terminal=None, **wifi),
    ]


# Rank 1 = highest retry rate; ties by more retried, then more transactions, then terminal
# id ascending, a key without a terminal last: T-3 and T-5 tie at 100 % (T-3 retried more);
# T-6, T-7 and T-0 tie at 0 retried (T-0 has fewer transactions, so comes after).
RANKING = [
    (D1, "mer_a", "T-3", 2, 2, 1.0, 1),
    (D1, "mer_a", "T-5", 1, 1, 1.0, 2),
    (D1, "mer_a", "T-1", 4, 3, 0.75, 3),
    (D1, "mer_a", "T-2", 3, 2, 2 / 3, 4),
    (D1, "mer_a", "T-6", 2, 0, 0.0, 5),
    (D1, "mer_a", "T-7", 2, 0, 0.0, 6),
    (D1, "mer_a", "T-0", 1, 0, 0.0, 7),
    (D1, "mer_a", None, 1, 0, 0.0, 8),
    (D1, "mer_b", "T-4", 1, 1, 1.0, 1),
    (D2, "mer_a", "T-1", 1, 0, 0.0, 1),
]

# Key metrics under the key's network and date, event metrics under the event's own.
# D1 gprs keys a1 a2 a3 a6 a7 a11 a12 a13: 8 transactions, 5 retried (a2 a3 a7 a11 a13),
#   2 in doubt (a2 a7), received 1+1+2+1+1+2+1+1 = 10, unseen 2+2+1+1+2 = 8 → 8/18;
#   events: 11 creates, no duplicate, lookup found 1 of 1 answered.
# D1 wifi keys a4 a5 a9 a14–a18: 8 transactions, 3 retried, received 2+1+2+5 = 10, unseen 1;
#   events: 10 creates, 3 replayed, a7's lookup not_found 0 of 1.
# D1 unknown: key a10 (1 of 1 unseen); events: the creates of a5 and a10 without a network.
# D2 gprs: key a19, its create; wifi: a11's replay (a D1 key) and a20's lookup, no key
#   (a20 is not a transaction, so no unknown row).
NETWORKS = [
    (D1, "gprs", 8, 11, 5, 5 / 8, 0, 0.0, 2, 0.25, 1.0, 8, 8 / 18),
    (D1, "unknown", 1, 2, 1, 1.0, 0, 0.0, 0, 0.0, 0.0, 1, 0.5),
    (D1, "wifi", 8, 10, 3, 3 / 8, 3, 0.3, 0, 0.0, 0.0, 1, 1 / 11),
    (D2, "gprs", 1, 1, 0, 0.0, 0, 0.0, 0, 0.0, 0.0, 0, 0.0),
    (D2, "wifi", 0, 1, 0, 0.0, 1, 1.0, 0, 0.0, 0.0, 0, 0.0),
]

# daily_summary's retry and link-loss columns (the other metrics: test_daily_summary).
# D1 A: 16 transactions, retried a2 a3 a4 a5 a7 a9 a11 a13, unseen 9 of 9 + 20 received.
SUMMARY_LINKS = [
    (D1, "mer_a", 16, 8, 0.5, 9, 9 / 29),
    (D1, "mer_b", 1, 1, 1.0, 1, 0.5),
    (D1, "ALL", 17, 9, 9 / 17, 10, 10 / 31),
    (D2, "mer_a", 1, 0, 0.0, 0, 0.0),
    (D2, "ALL", 1, 0, 0.0, 0, 0.0),
]
SUMMARY_LINK_COLUMNS = [
    "event_date",
    "merchant_id",
    "transactions",
    "retried_transactions",
    "retry_rate",
    "unseen_attempts",
    "link_loss_rate",
]

# terminal_link_loss (extra output): per terminal × the key's network.
LINK_LOSS = [
    (D1, "mer_a", "T-0", "wifi", 1, 1, 0, 0.0),
    (D1, "mer_a", "T-1", "gprs", 4, 6, 5, 5 / 11),
    (D1, "mer_a", "T-2", "gprs", 1, 1, 0, 0.0),
    (D1, "mer_a", "T-2", "wifi", 2, 3, 1, 0.25),
    (D1, "mer_a", "T-3", "gprs", 1, 1, 1, 0.5),
    (D1, "mer_a", "T-3", "wifi", 1, 2, 0, 0.0),
    (D1, "mer_a", "T-5", "gprs", 1, 1, 2, 2 / 3),
    (D1, "mer_a", "T-6", "wifi", 2, 2, 0, 0.0),
    (D1, "mer_a", "T-7", "wifi", 2, 2, 0, 0.0),
    (D1, "mer_a", None, "gprs", 1, 1, 0, 0.0),
    (D1, "mer_b", "T-4", "unknown", 1, 1, 1, 0.5),
    (D2, "mer_a", "T-1", "gprs", 1, 1, 0, 0.0),
]


def _spark_tables(spark: SparkSession) -> dict[str, DataFrame]:
    events = transforms.with_event_date(frame(spark, "request_events", _events()), "ts")
    cubes = transforms.cubes(events)
    txns = frame(spark, "transactions", [])
    summary = outputs.daily_summary(
        cubes,
        money.suspected_double_charges(txns),
        money.exactly_once_violations(txns, frame(spark, "ledger_entries", [])),
        offline.transaction_cube(txns),
        start=D1,
        end=D2,
    )
    return {
        "daily_summary": summary,
        "terminal_ranking": outputs.terminal_ranking(cubes.keys, start=D1, end=D2),
        "network_rates": outputs.network_rates(cubes, start=D1, end=D2),
        "terminal_link_loss": outputs.terminal_link_loss(cubes.keys, start=D1, end=D2),
    }


def _summary_links(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{c: row[c] for c in SUMMARY_LINK_COLUMNS} for row in rows]


def test_spark_ranking_networks_and_link_loss_by_hand(spark: SparkSession) -> None:
    tables = {name: collect(df) for name, df in _spark_tables(spark).items()}
    assert_rows_equal(tables["terminal_ranking"], as_dicts(RANKING, RANKING_COLUMNS))
    assert_rows_equal(tables["network_rates"], as_dicts(NETWORKS, NETWORK_COLUMNS))
    assert_rows_equal(
        _summary_links(tables["daily_summary"]), as_dicts(SUMMARY_LINKS, SUMMARY_LINK_COLUMNS)
    )
    assert_rows_equal(tables["terminal_link_loss"], as_dicts(LINK_LOSS, LINK_LOSS_COLUMNS))


def test_duckdb_reference_ranking_networks_and_link_loss_by_hand(tmp_path: Path) -> None:
    write_lake(tmp_path, "request_events", _events())
    write_lake(tmp_path, "transactions", [])
    write_lake(tmp_path, "ledger_entries", [])
    tables = duckdb_reference.audit(tmp_path, start=D1, end=D2, threads=2)
    assert_rows_equal(tables["terminal_ranking"], as_dicts(RANKING, RANKING_COLUMNS))
    assert_rows_equal(tables["network_rates"], as_dicts(NETWORKS, NETWORK_COLUMNS))
    assert_rows_equal(
        _summary_links(tables["daily_summary"]), as_dicts(SUMMARY_LINKS, SUMMARY_LINK_COLUMNS)
    )


# The same tables as the job writes them (the CSV is the contract): typed out by hand from
# RANKING and NETWORKS above — a null terminal is an empty cell, floats in shortest form.
RANKING_CSV = """\
event_date,merchant_id,terminal_id,transactions,retried_transactions,retry_rate,rank
2026-11-20,mer_a,T-3,2,2,1.0,1
2026-11-20,mer_a,T-5,1,1,1.0,2
2026-11-20,mer_a,T-1,4,3,0.75,3
2026-11-20,mer_a,T-2,3,2,0.6666666666666666,4
2026-11-20,mer_a,T-6,2,0,0.0,5
2026-11-20,mer_a,T-7,2,0,0.0,6
2026-11-20,mer_a,T-0,1,0,0.0,7
2026-11-20,mer_a,,1,0,0.0,8
2026-11-20,mer_b,T-4,1,1,1.0,1
2026-11-21,mer_a,T-1,1,0,0.0,1
"""
NETWORKS_CSV = """\
event_date,network,transactions,create_requests,retried_transactions,retry_rate,\
duplicate_requests,duplicate_rate,in_doubt_transactions,in_doubt_rate,lookup_found_rate,\
unseen_attempts,link_loss_rate
2026-11-20,gprs,8,11,5,0.625,0,0.0,2,0.25,1.0,8,0.4444444444444444
2026-11-20,unknown,1,2,1,1.0,0,0.0,0,0.0,0.0,1,0.5
2026-11-20,wifi,8,10,3,0.375,3,0.3,0,0.0,0.0,1,0.09090909090909091
2026-11-21,gprs,1,1,0,0.0,0,0.0,0,0.0,0.0,0,0.0
2026-11-21,wifi,0,1,0,0.0,1,1.0,0,0.0,0.0,0,0.0
"""


def test_the_job_writes_ranking_and_network_csvs_as_computed_by_hand(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The whole job on the lake on disk (read, dedup, every output): the two CSV files,
    character for character."""
    lake, out = tmp_path / "lake", tmp_path / "out"
    write_lake(lake, "request_events", _events())
    write_lake(lake, "transactions", [])
    write_lake(lake, "ledger_entries", [])
    run_audit(spark, lake=str(lake), out=out, start=D1, end=D2)
    assert (out / "terminal_ranking.csv").read_text() == RANKING_CSV
    assert (out / "network_rates.csv").read_text() == NETWORKS_CSV
