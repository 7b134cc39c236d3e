"""Benchmark: the Spark audit vs. a DuckDB single-node reference, on the same Parquet lake.

    .venv/bin/python -m analytics.bench_audit --events 1000000 --days 7 --master 'local[2]'

Synthesizes the lake (``idempay lake synth``; skipped with ``--lake`` of an existing one),
then, in one run: the Spark audit exactly as ``idempay audit`` runs it (all outputs and
report.html written; session start timed apart) and DuckDB computing daily_summary,
terminal_ranking, network_rates, the offline and duplicate-guard tables and the settlement
reconciliation against the synthesized clearing (``analytics.duckdb_reference``). The
engines' tables are compared row by row, every column, so the figures are for the same
answer.
Prints a table and, with ``--json``, writes the figures to a file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from analytics import duckdb_reference
from analytics.metrics import (
    EXCEPTION_COLUMNS,
    GUARD_COLUMNS,
    NETWORK_COLUMNS,
    OFFLINE_COLUMNS,
    OFFLINE_TERMINAL_COLUMNS,
    RANKING_COLUMNS,
    RECON_COLUMNS,
    SUMMARY_COLUMNS,
)

COMPARED = {
    "daily_summary": SUMMARY_COLUMNS,
    "terminal_ranking": RANKING_COLUMNS,
    "network_rates": NETWORK_COLUMNS,
    "offline_summary": OFFLINE_COLUMNS,
    "offline_terminals": OFFLINE_TERMINAL_COLUMNS,
    "duplicate_guard": GUARD_COLUMNS,
    "settlement_recon": RECON_COLUMNS,
    "settlement_exceptions": EXCEPTION_COLUMNS,
}


def _synth(lake: Path, *, events: int, days: int, seed: int) -> tuple[int, float]:
    from analytics.synth import SynthConfig, synthesize

    started = time.perf_counter()
    config = SynthConfig(
        lake=lake, days=days, events_per_day=math.ceil(events / days), seed=seed, violations=1
    )
    result = synthesize(config)
    return result.events, time.perf_counter() - started


def _lake_events(lake: Path) -> int:
    import pyarrow.dataset as ds

    return int(ds.dataset(lake / "request_events", format="parquet").count_rows())


def _jvm_cpu_s(spark: Any) -> float:
    """CPU seconds (user + system, all threads) of the local driver JVM so far."""
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    if proc is None:
        return float("nan")
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _spark(lake: Path, out: Path, *, start: date, end: date, master: str) -> dict[str, Any]:
    from analytics.jobs.daily_audit import run_audit
    from analytics.session import build_session

    started = time.perf_counter()
    spark = build_session(master)
    session_s = time.perf_counter() - started
    try:
        cpu_before = _jvm_cpu_s(spark)
        job_started = time.perf_counter()
        result = run_audit(spark, lake=str(lake), out=out, start=start, end=end)
        job_s = time.perf_counter() - job_started
        cpu_s = _jvm_cpu_s(spark) - cpu_before
    finally:
        spark.stop()
    return {
        "session_s": session_s,
        "job_s": job_s,
        "job_cpu_s": cpu_s,
        "wall_s": time.perf_counter() - started,
        "tables": {name: result.rows[name] for name in COMPARED},
    }


def _duckdb(lake: Path, *, start: date, end: date, threads: int) -> dict[str, Any]:
    started, cpu_started = time.perf_counter(), time.process_time()
    tables = duckdb_reference.audit(lake, start=start, end=end, threads=threads)
    return {
        "wall_s": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu_started,
        "tables": tables,
    }


def compare(
    spark_rows: list[dict[str, Any]],
    duck_rows: list[dict[str, Any]],
    columns: list[str] = SUMMARY_COLUMNS,
) -> list[str]:
    """Differences between the engines' rows of one table (empty: the same answer)."""
    if len(spark_rows) != len(duck_rows):
        return [f"row count: spark {len(spark_rows)} vs duckdb {len(duck_rows)}"]
    problems = []
    for s_row, d_row in zip(spark_rows, duck_rows, strict=True):
        for column in columns:
            a, b = s_row[column], d_row[column]
            same = (a is None and b is None) or (
                a is not None and b is not None and
                (a == b if isinstance(a, str) else math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9))
            )  # fmt: skip
            if not same:
                where = " ".join(str(s_row[c]) for c in columns[:3])
                problems.append(f"{where} {column}: {a} vs {b}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--duckdb-threads", type=int, default=2)
    parser.add_argument("--lake", type=Path, default=None, help="an existing lake to reuse")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="idempay-bench-audit-"))
    figures: dict[str, Any] = {
        "master": args.master,
        "duckdb_threads": args.duckdb_threads,
        "load_average_at_start": round(os.getloadavg()[0], 2),
    }
    if args.lake is None:
        lake = work / "lake"
        events, synth_s = _synth(lake, events=args.events, days=args.days, seed=args.seed)
        figures["synth_s"] = round(synth_s, 2)
    else:
        lake = args.lake
        events = _lake_events(lake)
    days = sorted(p.name.split("=", 1)[1] for p in (lake / "request_events").glob("event_date=*"))
    start, end = date.fromisoformat(days[0]), date.fromisoformat(days[-1])
    if args.lake is None:  # not the day after, which holds only what ran past midnight
        end = min(end, start + timedelta(days=args.days - 1))
    figures.update(events=events, start=start.isoformat(), end=end.isoformat())

    spark = _spark(lake, work / "out", start=start, end=end, master=args.master)
    duck = _duckdb(lake, start=start, end=end, threads=args.duckdb_threads)
    problems = [
        f"{name}: {problem}"
        for name, columns in COMPARED.items()
        for problem in compare(spark["tables"][name], duck["tables"][name], columns)
    ]
    figures.update(
        spark_session_s=round(spark["session_s"], 2),
        spark_job_s=round(spark["job_s"], 2),
        spark_job_cpu_s=round(spark["job_cpu_s"], 2),
        spark_wall_s=round(spark["wall_s"], 2),
        spark_events_per_s=round(events / spark["wall_s"]),
        spark_job_events_per_s=round(events / spark["job_s"]),
        duckdb_wall_s=round(duck["wall_s"], 2),
        duckdb_cpu_s=round(duck["cpu_s"], 2),
        duckdb_events_per_s=round(events / duck["wall_s"]),
        summary_rows=len(spark["tables"]["daily_summary"]),
        compared_rows=sum(len(rows) for rows in spark["tables"].values()),
        engines_agree=not problems,
        load_average_at_end=round(os.getloadavg()[0], 2),
        out=str(work / "out"),
    )
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        sys.stdout.write(f"{key:<{width}}  {value}\n")
    for problem in problems[:20]:
        sys.stdout.write(f"DIFF {problem}\n")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
