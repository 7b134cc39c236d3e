"""contract §5 in DuckDB SQL: daily_summary, terminal_ranking and network_rates, a single-node
reference for the benchmark and an independent second implementation of the contract (the
benchmark compares the two engines' answers row by row, and the analytics tests hold both
to the same hand-computed values). quantile_cont is the same linear interpolation as
Spark's exact ``percentile``. Also the offline and duplicate-guard outputs (issues 16, 17:
offline_summary, offline_terminals, duplicate_guard), held to the same hand-computed values
as ``analytics.offline``. And the settlement reconciliation against the acquirer's clearing
(settlement_recon, settlement_exceptions), written from contract §5 apart from
``analytics.settlement``; only the choice of clearing days to read (those whose rows agree
with their landed trailer) is shared, ``analytics.clearing``.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import duckdb

from analytics import clearing

RESOLVING = "('found', 'created', 'replayed', 'aborted', 'fenced')"
PART = "event_date=????-??-??"  # as the Spark job: only well-named partitions

SQL = """
CREATE OR REPLACE TEMP VIEW ev AS
  SELECT DISTINCT ON (event_id) *, CAST(ts AS DATE) AS event_date
  FROM read_parquet('{lake}/request_events/{part}/*.parquet', hive_partitioning = false,
                    union_by_name = true);
CREATE OR REPLACE TEMP VIEW tx_files AS
  SELECT * FROM read_parquet('{lake}/transactions/{part}/*.parquet', hive_partitioning = false,
                             union_by_name = true);
CREATE OR REPLACE TEMP VIEW le AS
  SELECT DISTINCT ON (entry_id) *
  FROM read_parquet('{lake}/ledger_entries/{part}/*.parquet', hive_partitioning = false);

CREATE OR REPLACE TEMP VIEW tx AS
  SELECT DISTINCT ON (merchant_id, transaction_id) * {absent} FROM tx_files;

CREATE OR REPLACE TEMP TABLE keys AS
WITH first_lookup AS (
  SELECT merchant_id, idempotency_key, min(ts) FILTER (WHERE endpoint = 'lookup') AS fl
  FROM ev GROUP BY ALL
), k AS (
  SELECT e.merchant_id, e.idempotency_key,
    CAST(min(e.ts) AS DATE) AS event_date,
    bool_or(endpoint = 'create' AND outcome = 'created') AS is_transaction,
    count(*) FILTER (WHERE endpoint = 'create' AND outcome <> 'key_reused') AS attempts,
    count(*) FILTER (WHERE endpoint = 'create' AND outcome <> 'key_reused'
                     AND attempt IS NOT NULL) AS numbered,
    max(attempt) FILTER (WHERE endpoint = 'create' AND outcome <> 'key_reused') AS highest,
    struct_extract(min({{'ts': e.ts, 'v': terminal_id}}) FILTER (WHERE terminal_id IS NOT NULL),
                   'v') AS terminal_id,
    struct_extract(min({{'ts': e.ts, 'v': network}})
                   FILTER (WHERE endpoint = 'create' AND network IS NOT NULL), 'v') AS network,
    count(*) FILTER (WHERE endpoint = 'lookup') AS lookups,
    min(e.ts) FILTER (WHERE endpoint = 'create') AS first_create,
    min(e.ts) FILTER (WHERE outcome IN {resolving} AND e.ts >= fl) AS resolved,
    bool_or(endpoint = 'abort' AND outcome = 'aborted') AS aborted,
    bool_or(endpoint = 'create' AND outcome = 'expired') AS expired,
    bool_or(endpoint = 'reversal' AND outcome = 'reversed') AS reversed
  FROM ev e JOIN first_lookup USING (merchant_id, idempotency_key)
  GROUP BY e.merchant_id, e.idempotency_key
)
SELECT * REPLACE (coalesce(network, 'unknown') AS network),
  is_transaction AND (attempts >= 2 OR coalesce(highest, 0) >= 2) AS is_retried,
  CASE WHEN is_transaction THEN numbered ELSE 0 END AS received_attempts,
  CASE WHEN is_transaction THEN greatest(coalesce(highest, 0) - numbered, 0) ELSE 0 END
    AS unseen_attempts,
  is_transaction AND lookups >= 1 AS is_in_doubt,
  CASE WHEN is_transaction AND lookups >= 1
    THEN (epoch_us(resolved) - epoch_us(first_create)) / 1e6 END AS resolution_s
FROM k;

CREATE OR REPLACE TEMP TABLE suspects AS
WITH ordered AS (
  SELECT *, lag(transaction_id) OVER w AS first_id, lag(created_at) OVER w AS first_at
  FROM tx WHERE type = 'purchase' AND status = 'approved'
  WINDOW w AS (PARTITION BY merchant_id, terminal_id, card_fingerprint, amount, currency
               ORDER BY created_at, transaction_id)
)
SELECT CAST(created_at AS DATE) AS event_date, merchant_id
FROM ordered
WHERE first_id IS NOT NULL AND first_id <> transaction_id
  AND epoch_us(created_at) - epoch_us(first_at) <= 120000000;

CREATE OR REPLACE TEMP TABLE violations AS
WITH known AS (SELECT merchant_id, transaction_id, min(created_at) AS at FROM tx GROUP BY ALL),
charges AS (SELECT * FROM le WHERE kind = 'charge'),
doubled AS (
  SELECT CAST(k.at AS DATE) AS event_date, c.merchant_id
  FROM (SELECT merchant_id, transaction_id FROM charges GROUP BY ALL HAVING count(*) > 1) c
  JOIN known k USING (merchant_id, transaction_id)
)
SELECT * FROM doubled
UNION ALL
SELECT CAST(c.created_at AS DATE), c.merchant_id FROM charges c
ANTI JOIN known k USING (merchant_id, transaction_id);
"""

SUMMARY = """
WITH e AS (
  SELECT event_date, coalesce(merchant_id, 'ALL') AS merchant_id,
    count(*) FILTER (WHERE endpoint = 'create') AS create_requests,
    count(*) FILTER (WHERE endpoint = 'create' AND outcome IN ('replayed', 'in_progress'))
      AS duplicate_requests,
    count(*) FILTER (WHERE endpoint = 'lookup' AND outcome = 'found') AS found,
    count(*) FILTER (WHERE endpoint = 'lookup' AND outcome IN ('found', 'not_found')) AS answered,
    count(*) FILTER (WHERE endpoint = 'create' AND outcome = 'key_reused') AS key_reused,
    quantile_cont(latency_ms, 0.5) FILTER (WHERE endpoint = 'create') AS create_p50_ms,
    quantile_cont(latency_ms, 0.95) FILTER (WHERE endpoint = 'create') AS create_p95_ms,
    quantile_cont(latency_ms, 0.99) FILTER (WHERE endpoint = 'create') AS create_p99_ms
  FROM ev GROUP BY GROUPING SETS ((event_date, merchant_id), (event_date))
), k AS (
  SELECT event_date, coalesce(merchant_id, 'ALL') AS merchant_id,
    count(*) FILTER (WHERE is_transaction) AS transactions,
    count(*) FILTER (WHERE is_retried) AS retried_transactions,
    sum(unseen_attempts) AS unseen, sum(received_attempts) AS received,
    count(*) FILTER (WHERE is_in_doubt) AS in_doubt_transactions,
    count(*) FILTER (WHERE aborted) AS aborted,
    count(*) FILTER (WHERE expired) AS expired,
    count(*) FILTER (WHERE reversed) AS reversed,
    quantile_cont(resolution_s, 0.5) AS in_doubt_resolution_p50_s,
    quantile_cont(resolution_s, 0.95) AS in_doubt_resolution_p95_s
  FROM keys GROUP BY GROUPING SETS ((event_date, merchant_id), (event_date))
), s AS (
  SELECT event_date, coalesce(merchant_id, 'ALL') AS merchant_id, count(*) AS n
  FROM suspects GROUP BY GROUPING SETS ((event_date, merchant_id), (event_date))
), v AS (
  SELECT event_date, coalesce(merchant_id, 'ALL') AS merchant_id, count(*) AS n
  FROM violations GROUP BY GROUPING SETS ((event_date, merchant_id), (event_date))
), t AS (
  SELECT CAST(created_at AS DATE) AS event_date, coalesce(merchant_id, 'ALL') AS merchant_id,
    count(*) AS n
  FROM tx WHERE status = 'declined' AND decline_reason = 'acquirer_timeout'
  GROUP BY GROUPING SETS ((event_date, merchant_id), (event_date))
), days AS (
  SELECT CAST(d AS DATE) AS event_date, 'ALL' AS merchant_id
  FROM generate_series(DATE '{start}', DATE '{end}', INTERVAL 1 DAY) t(d)
)
SELECT event_date, merchant_id,
  coalesce(transactions, 0) AS transactions,
  coalesce(create_requests, 0) AS create_requests,
  coalesce(retried_transactions, 0) AS retried_transactions,
  coalesce(retried_transactions / nullif(transactions, 0), 0.0) AS retry_rate,
  CAST(coalesce(unseen, 0) AS BIGINT) AS unseen_attempts,
  coalesce(unseen / nullif(unseen + received, 0), 0.0) AS link_loss_rate,
  coalesce(duplicate_requests, 0) AS duplicate_requests,
  coalesce(duplicate_requests / nullif(create_requests, 0), 0.0) AS duplicate_rate,
  coalesce(in_doubt_transactions, 0) AS in_doubt_transactions,
  coalesce(in_doubt_transactions / nullif(transactions, 0), 0.0) AS in_doubt_rate,
  coalesce(found / nullif(answered, 0), 0.0) AS lookup_found_rate,
  in_doubt_resolution_p50_s, in_doubt_resolution_p95_s,
  coalesce(key_reused, 0) AS key_reused,
  coalesce(aborted, 0) AS aborted,
  coalesce(expired, 0) AS expired,
  coalesce(reversed, 0) AS reversed,
  coalesce(t.n, 0) AS acquirer_timeouts,
  coalesce(t.n / nullif(transactions, 0), 0.0) AS acquirer_timeout_rate,
  coalesce(s.n, 0) AS suspected_double_charges,
  coalesce(v.n, 0) AS exactly_once_violations,
  create_p50_ms, create_p95_ms, create_p99_ms
FROM e FULL JOIN k USING (event_date, merchant_id)
  FULL JOIN s USING (event_date, merchant_id)
  FULL JOIN v USING (event_date, merchant_id)
  FULL JOIN t USING (event_date, merchant_id)
  FULL JOIN days USING (event_date, merchant_id)
WHERE event_date BETWEEN DATE '{start}' AND DATE '{end}'
ORDER BY event_date, merchant_id = 'ALL', merchant_id
"""

TERMINAL_RANKING = """
WITH t AS (
  SELECT event_date, merchant_id, terminal_id, count(*) AS transactions,
    count(*) FILTER (WHERE is_retried) AS retried_transactions
  FROM keys WHERE is_transaction GROUP BY ALL
)
SELECT *, retried_transactions / transactions AS retry_rate,
  row_number() OVER (PARTITION BY event_date, merchant_id
    ORDER BY retry_rate DESC, retried_transactions DESC, transactions DESC,
             terminal_id ASC NULLS LAST) AS rank
FROM t
WHERE event_date BETWEEN DATE '{start}' AND DATE '{end}'
ORDER BY event_date, merchant_id, rank
"""

NETWORK_RATES = """
WITH e AS (
  SELECT event_date, coalesce(network, 'unknown') AS network,
    count(*) FILTER (WHERE endpoint = 'create') AS create_requests,
    count(*) FILTER (WHERE endpoint = 'create' AND outcome IN ('replayed', 'in_progress'))
      AS duplicate_requests,
    count(*) FILTER (WHERE endpoint = 'lookup' AND outcome = 'found') AS found,
    count(*) FILTER (WHERE endpoint = 'lookup' AND outcome IN ('found', 'not_found')) AS answered
  FROM ev GROUP BY ALL
), k AS (
  SELECT event_date, network, count(*) AS transactions,
    count(*) FILTER (WHERE is_retried) AS retried_transactions,
    count(*) FILTER (WHERE is_in_doubt) AS in_doubt_transactions,
    sum(unseen_attempts) AS unseen, sum(received_attempts) AS received
  FROM keys WHERE is_transaction GROUP BY ALL
)
SELECT event_date, network,
  coalesce(transactions, 0) AS transactions,
  coalesce(create_requests, 0) AS create_requests,
  coalesce(retried_transactions, 0) AS retried_transactions,
  coalesce(retried_transactions / nullif(transactions, 0), 0.0) AS retry_rate,
  coalesce(duplicate_requests, 0) AS duplicate_requests,
  coalesce(duplicate_requests / nullif(create_requests, 0), 0.0) AS duplicate_rate,
  coalesce(in_doubt_transactions, 0) AS in_doubt_transactions,
  coalesce(in_doubt_transactions / nullif(transactions, 0), 0.0) AS in_doubt_rate,
  coalesce(found / nullif(answered, 0), 0.0) AS lookup_found_rate,
  CAST(coalesce(unseen, 0) AS BIGINT) AS unseen_attempts,
  coalesce(unseen / nullif(unseen + received, 0), 0.0) AS link_loss_rate
FROM e FULL JOIN k USING (event_date, network)
WHERE event_date BETWEEN DATE '{start}' AND DATE '{end}'
ORDER BY event_date, network
"""

# Offline selling (issue 16), from the transactions: one row each, on created_at's date.
OFFLINE_ROWS = """
CREATE OR REPLACE TEMP TABLE txo AS
SELECT CAST(created_at AS DATE) AS event_date, merchant_id, terminal_id, currency, amount,
  coalesce(offline, false) AS is_offline,
  coalesce(offline, false) AND status = 'declined' AS is_declined,
  coalesce(duplicate_override, false) AS overridden,
  CASE WHEN coalesce(offline, false) AND captured_at IS NOT NULL
    THEN (epoch_us(created_at) - epoch_us(captured_at)) / 1e6 END AS delay_s,
  coalesce(offline, false) AND CAST(captured_at AS DATE) < CAST(created_at AS DATE) AS late
FROM tx
"""
OFFLINE_SUMS = """
  count(*) AS transactions,
  count(*) FILTER (WHERE is_offline) AS offline_transactions,
  quantile_cont(delay_s, 0.5) AS forward_delay_p50_s,
  quantile_cont(delay_s, 0.95) AS forward_delay_p95_s,
  max(delay_s) AS forward_delay_max_s,
  count(*) FILTER (WHERE is_declined) AS offline_declined,
  CAST(coalesce(sum(amount) FILTER (WHERE is_declined), 0) AS BIGINT) AS offline_amount_at_risk,
  count(*) FILTER (WHERE late) AS forwarded_after_day_end
"""
OFFLINE_METRICS = """
  transactions, offline_transactions,
  coalesce(offline_transactions / nullif(transactions, 0), 0.0) AS offline_rate,
  forward_delay_p50_s, forward_delay_p95_s, forward_delay_max_s, offline_declined,
  coalesce(offline_declined / nullif(offline_transactions, 0), 0.0) AS offline_decline_rate,
  offline_amount_at_risk, forwarded_after_day_end
"""
OFFLINE_SUMMARY = f"""
WITH o AS (
  SELECT event_date, coalesce(merchant_id, 'ALL') AS merchant_id, currency, {OFFLINE_SUMS}
  FROM txo GROUP BY GROUPING SETS ((event_date, currency, merchant_id), (event_date, currency))
)
SELECT event_date, merchant_id, currency, {OFFLINE_METRICS}
FROM o
WHERE event_date BETWEEN DATE '{{start}}' AND DATE '{{end}}'
ORDER BY event_date, merchant_id = 'ALL', merchant_id, currency
"""
OFFLINE_TERMINALS = f"""
WITH o AS (
  SELECT event_date, merchant_id, terminal_id, currency, {OFFLINE_SUMS}
  FROM txo GROUP BY ALL
)
SELECT event_date, merchant_id, terminal_id, currency, {OFFLINE_METRICS}
FROM o
WHERE offline_transactions > 0 AND event_date BETWEEN DATE '{{start}}' AND DATE '{{end}}'
ORDER BY event_date, merchant_id, terminal_id NULLS LAST, currency
"""
# The duplicate guard (issue 17): 409 rejections of creates, and confirmed duplicates.
DUPLICATE_GUARD = """
WITH b AS (
  SELECT event_date, coalesce(merchant_id, 'ALL') AS merchant_id,
    count(*) FILTER (WHERE endpoint = 'create' AND outcome = 'rejected' AND http_status = 409)
      AS blocked
  FROM ev GROUP BY GROUPING SETS ((event_date, merchant_id), (event_date))
), o AS (
  SELECT event_date, coalesce(merchant_id, 'ALL') AS merchant_id,
    count(*) FILTER (WHERE overridden) AS overridden
  FROM txo GROUP BY GROUPING SETS ((event_date, merchant_id), (event_date))
), days AS (
  SELECT CAST(d AS DATE) AS event_date, 'ALL' AS merchant_id
  FROM generate_series(DATE '{start}', DATE '{end}', INTERVAL 1 DAY) t(d)
)
SELECT event_date, merchant_id,
  coalesce(blocked, 0) AS duplicates_blocked, coalesce(overridden, 0) AS duplicates_overridden
FROM b FULL JOIN o USING (event_date, merchant_id) FULL JOIN days USING (event_date, merchant_id)
WHERE event_date BETWEEN DATE '{start}' AND DATE '{end}'
  AND (merchant_id = 'ALL' OR coalesce(blocked, 0) + coalesce(overridden, 0) > 0)
ORDER BY event_date, merchant_id = 'ALL', merchant_id
"""

# Settlement reconciliation (contract §5): our transactions and the clearing rows by rrn.
CLEARING_ROWS = r"""
CREATE OR REPLACE TEMP VIEW cl AS
  SELECT *, CAST(regexp_extract(filename, 'clearing_date=(\d{{4}}-\d{{2}}-\d{{2}})', 1) AS DATE)
    AS clearing_date
  FROM read_parquet({files}, filename = true)
"""
NO_CLEARING_ROWS = """
CREATE OR REPLACE TEMP VIEW cl AS
  SELECT NULL::VARCHAR AS rrn, NULL::VARCHAR AS merchant_id, NULL::VARCHAR AS processing_code,
    NULL::BIGINT AS amount, NULL::VARCHAR AS currency, NULL::TIMESTAMPTZ AS approved_at,
    NULL::TIMESTAMPTZ AS reversed_at, NULL::DATE AS clearing_date
  WHERE false
"""
SETTLEMENT = """
CREATE OR REPLACE TEMP TABLE recon AS
WITH ours AS (
  SELECT rrn, transaction_id, merchant_id, CAST(created_at AS DATE) AS event_date, status,
    CASE WHEN type = 'refund' THEN -amount ELSE amount END AS amount, currency
  FROM tx WHERE rrn IS NOT NULL
), approved AS (
  SELECT DISTINCT ON (rrn) * FROM ours WHERE status = 'approved'
  ORDER BY rrn, event_date, transaction_id, merchant_id, amount, currency
), any_ours AS (
  SELECT DISTINCT ON (rrn) * FROM ours
  ORDER BY rrn, event_date, transaction_id, merchant_id, amount, currency
), c AS (
  SELECT rrn, clearing_date, merchant_id, approved_at, reversed_at IS NULL AS open, currency,
    CASE WHEN processing_code LIKE '20%' THEN -amount ELSE amount END AS amount
  FROM cl
), first_open AS (
  SELECT DISTINCT ON (rrn) rrn, clearing_date, merchant_id, amount, currency FROM c WHERE open
  ORDER BY rrn, approved_at, clearing_date, merchant_id, amount, currency
), per_rrn AS (
  SELECT rrn, count(*) AS n, sum(amount) FILTER (WHERE open) AS open_amount,
    max({'d': clearing_date, 'm': merchant_id}) AS last
  FROM c GROUP BY rrn
)
SELECT a.event_date, a.merchant_id,
  CASE WHEN f.rrn IS NULL THEN 'ours_only'
       WHEN f.amount = a.amount AND f.currency = a.currency THEN 'matched'
       ELSE 'amount_mismatch' END AS kind,
  a.rrn, a.transaction_id, a.amount, a.currency, f.amount AS clearing_amount
FROM approved a LEFT JOIN first_open f USING (rrn)
WHERE a.event_date IN (SELECT d FROM clearing_days)
UNION ALL
SELECT f.clearing_date, f.merchant_id, 'acquirer_only', f.rrn, o.transaction_id, o.amount,
  coalesce(o.currency, f.currency), f.amount
FROM first_open f LEFT JOIN any_ours o USING (rrn)
WHERE NOT EXISTS (SELECT 1 FROM approved a WHERE a.rrn = f.rrn)
UNION ALL
SELECT p.last.d, p.last.m, 'duplicate_rrn', p.rrn, o.transaction_id, o.amount,
  coalesce(o.currency, f.currency), p.open_amount
FROM per_rrn p LEFT JOIN any_ours o USING (rrn) LEFT JOIN first_open f USING (rrn)
WHERE p.n > 1
"""
SETTLEMENT_RECON = """
WITH g AS (
  SELECT event_date, coalesce(merchant_id, 'ALL') AS merchant_id,
    count(*) FILTER (WHERE kind = 'matched') AS matched,
    coalesce(sum(amount) FILTER (WHERE kind = 'matched'), 0) AS matched_amount,
    count(*) FILTER (WHERE kind = 'acquirer_only') AS acquirer_only,
    count(*) FILTER (WHERE kind = 'ours_only') AS ours_only,
    count(*) FILTER (WHERE kind = 'amount_mismatch') AS amount_mismatch,
    count(*) FILTER (WHERE kind = 'duplicate_rrn') AS duplicate_rrn
  FROM recon GROUP BY GROUPING SETS ((event_date, merchant_id), (event_date))
), days AS (SELECT d AS event_date, 'ALL' AS merchant_id FROM clearing_days)
SELECT event_date, merchant_id, coalesce(matched, 0) AS matched,
  CAST(coalesce(matched_amount, 0) AS BIGINT) AS matched_amount,
  coalesce(acquirer_only, 0) AS acquirer_only, coalesce(ours_only, 0) AS ours_only,
  coalesce(amount_mismatch, 0) AS amount_mismatch, coalesce(duplicate_rrn, 0) AS duplicate_rrn
FROM g FULL JOIN days USING (event_date, merchant_id)
WHERE event_date BETWEEN DATE '{start}' AND DATE '{end}'
ORDER BY event_date, merchant_id = 'ALL', merchant_id
"""
SETTLEMENT_EXCEPTIONS = """
SELECT event_date, merchant_id, kind, rrn, transaction_id, amount, currency, clearing_amount
FROM recon
WHERE kind <> 'matched' AND event_date BETWEEN DATE '{start}' AND DATE '{end}'
ORDER BY event_date, merchant_id, kind, rrn
"""

OUTPUTS = {
    "daily_summary": SUMMARY,
    "terminal_ranking": TERMINAL_RANKING,
    "network_rates": NETWORK_RATES,
    "offline_summary": OFFLINE_SUMMARY,
    "offline_terminals": OFFLINE_TERMINALS,
    "duplicate_guard": DUPLICATE_GUARD,
    "settlement_recon": SETTLEMENT_RECON,
    "settlement_exceptions": SETTLEMENT_EXCEPTIONS,
}
# Columns of lake schema 2 a lake may lack altogether (written before them): null.
ADDED_TYPES = {
    "offline": "BOOLEAN",
    "captured_at": "TIMESTAMPTZ",
    "duplicate_override": "BOOLEAN",
    "rrn": "VARCHAR",
    "authorization_code": "VARCHAR",
    "decline_reason": "VARCHAR",
}
Rows = list[dict[str, Any]]


def _fetch(conn: duckdb.DuckDBPyConnection, query: str) -> Rows:
    cursor = conn.execute(query)
    columns = [d[0] for d in cursor.description]
    return [
        {
            c: (v.isoformat() if isinstance(v, date) else v)
            for c, v in zip(columns, row, strict=True)
        }
        for row in cursor.fetchall()
    ]


def _absent_columns(conn: duckdb.DuckDBPyConnection, lake: str) -> str:
    """``, NULL::T AS c`` for each column added since lake schema 1 that no transactions
    file has."""
    files = f"'{lake}/transactions/{PART}/*.parquet'"
    query = f"SELECT * FROM read_parquet({files}, union_by_name = true) LIMIT 0"
    present = {d[0] for d in conn.execute(query).description}
    return "".join(
        f", NULL::{kind} AS {name}" for name, kind in ADDED_TYPES.items() if name not in present
    )


def _settlement(conn: duckdb.DuckDBPyConnection, lake: Path) -> None:
    """The ``recon`` table: each rrn's match or exceptions (kind ``matched`` for a match)."""
    days = [
        (day, folder) for day, folder in clearing.partitions(lake) if not clearing.verify(folder)
    ]
    conn.execute("CREATE OR REPLACE TEMP TABLE clearing_days (d DATE)")
    for day, _ in days:
        conn.execute("INSERT INTO clearing_days VALUES (?)", [day])
    files = [str(path) for _, folder in days for path in sorted(folder.glob("*.parquet"))]
    conn.execute(CLEARING_ROWS.format(files=files) if files else NO_CLEARING_ROWS)
    conn.execute(SETTLEMENT)


def audit(lake: Path, *, start: date, end: date, threads: int) -> dict[str, Rows]:
    """daily_summary, terminal_ranking, network_rates, offline_summary, offline_terminals,
    duplicate_guard, settlement_recon and settlement_exceptions (dates as ISO strings), by
    DuckDB."""
    conn = duckdb.connect()
    try:
        conn.execute(f"SET threads = {int(threads)}")
        conn.execute("SET TimeZone = 'UTC'")
        root = Path(lake).as_posix()
        absent = _absent_columns(conn, root)
        conn.execute(SQL.format(lake=root, resolving=RESOLVING, part=PART, absent=absent))
        conn.execute(OFFLINE_ROWS)
        _settlement(conn, Path(lake))
        bounds = {"start": start.isoformat(), "end": end.isoformat()}
        return {name: _fetch(conn, query.format(**bounds)) for name, query in OUTPUTS.items()}
    finally:
        conn.close()


def daily_summary(lake: Path, *, start: date, end: date, threads: int) -> Rows:
    """The daily summary's rows (dates as ISO strings), computed by DuckDB."""
    return audit(lake, start=start, end=end, threads=threads)["daily_summary"]
