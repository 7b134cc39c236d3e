"""Settings of the Postgres server that idempay relies on but does not set itself, checked
when ``idempay serve`` and ``idempay migrate`` start (docs/operations.md, "Postgres settings").

Only one so far: **autovacuum** (with ``track_counts``, which it needs). Postgres plans a
prepared statement once and keeps the plan until the table's statistics change — and
without autovacuum they never do. Measured here (docs/benchmarks.md, "Postgres without
autovacuum"): the ledger's foreign-key check (``SELECT 1 FROM ONLY transaction … FOR KEY
SHARE``, run inside every create) planned while ``transaction`` was empty picks the merchant's
listing index and filters on the id, so each create read every row of its merchant — the create
fell from ~600 to ~90 a second within a minute on a fresh database, and stays there. A server with
autovacuum analyzes a table after 50 rows + 10 % of it change, which invalidates those
plans. A warning, not a refusal: the server still answers correctly, only slower.
"""

from __future__ import annotations

import asyncio

import structlog
from sqlalchemy import text

from api.config import Settings
from api.logs import configure_logging

# setting → why idempay needs it on
REQUIRED_ON = {
    "autovacuum": "plans cached while tables were small are never refreshed: the create's"
    " ledger foreign-key check reads every row of the merchant (docs/operations.md)",
    "track_counts": "autovacuum needs it to know which tables changed",
}


async def postgres_warnings(settings: Settings) -> list[str]:
    """One line per server setting idempay needs that is off; none on SQLite. A database
    that cannot be reached gives none (the server's own start reports that)."""
    if settings.is_sqlite:
        return []
    from api.db import create_engine

    engine = create_engine(settings)
    try:
        async with engine.connect() as conn:
            found = {
                name: str((await conn.execute(text(f"SHOW {name}"))).scalar_one())
                for name in REQUIRED_ON
            }
    except Exception:  # unreachable or refusing: not this check's to report
        return []
    finally:
        await engine.dispose()
    return [
        f"Postgres has {name}={value}: {REQUIRED_ON[name]}"
        for name, value in found.items()
        if value != "on"
    ]


def warn_about_postgres(settings: Settings) -> list[str]:
    """``postgres_warnings``, each logged as a ``postgres_setting`` warning in the server's
    own log format (one JSON record per line by default: ``api.logs``). Runs its own event
    loop: call it outside a running loop."""
    warnings = asyncio.run(postgres_warnings(settings))
    if warnings:
        configure_logging(settings)
        log = structlog.get_logger("idempay.pg_checks")
        for line in warnings:
            log.warning("postgres_setting", detail=line)
    return warnings
