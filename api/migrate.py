"""Apply Alembic migrations to the configured database (``idempay migrate`` and ``serve``)."""

from __future__ import annotations

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
    """Upgrade to head. Runs its own event loop: call it outside a running loop."""
    if settings.is_sqlite:
        settings.var_dir.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(settings), "head")
