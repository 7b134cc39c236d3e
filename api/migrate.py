"""Apply Alembic migrations to the configured database (``idempay migrate`` and ``serve``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config

from api.config import Settings

MIGRATIONS = Path(__file__).with_name("migrations")
# Postgres advisory lock held (per transaction) while migrations run: replicas that start
# together (each `idempay serve` migrates) take turns; the later ones find the schema at head.
MIGRATION_LOCK = 0x1DE4_3160


def alembic_config(settings: Settings) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("file_template", "%%(year)d_%%(month).2d_%%(day).2d_%%(rev)s_%%(slug)s")
    config.set_main_option("sqlalchemy.url", settings.resolved_database_url.replace("%", "%%"))
    return config


def migrate(settings: Settings) -> None:
    """Upgrade to head and make sure the database has its epoch (contract §3.6; kept, never
    renewed here: ``idempay admin new-epoch`` does that after a restore). Runs its own
    event loops: call it outside a running loop."""
    if settings.is_sqlite:
        settings.var_dir.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(settings), "head")
    asyncio.run(_ensure_epoch(settings))


async def _ensure_epoch(settings: Settings) -> None:
    from api.db import create_engine
    from api.idempotency.epoch import ensure_epoch

    engine = create_engine(settings)
    try:
        await ensure_epoch(engine)
    finally:
        await engine.dispose()
