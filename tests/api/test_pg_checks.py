"""The start-up check of the Postgres settings idempay needs on (api/pg_checks.py): a
setting that is off is named, with why; SQLite and an unreachable server give nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.config import Settings
from api.pg_checks import postgres_warnings, warn_about_postgres
from idempay_tools.private_services import admin_sql, create_database, drop_database, pg_url
from tests.support.backend import Backend


@pytest.fixture
def database() -> Iterator[str]:
    name = create_database()
    try:
        yield name
    finally:
        drop_database(name)


def _shown(name: str, setting: str) -> str:
    backend = Backend("postgres", pg_url(name), Path("."))
    return str(backend.sql(f"SHOW {setting}")[0][0])


def test_a_setting_that_is_off_is_named_with_why(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # track_counts can be turned off for one database (autovacuum only server-wide):
    # this database's sessions run without it, whatever the machine's configuration.
    admin_sql(f"ALTER DATABASE {database} SET track_counts = off")
    settings = Settings(database_url=pg_url(database))
    warnings = warn_about_postgres(settings)
    assert any(w.startswith("Postgres has track_counts=off: autovacuum needs it") for w in warnings)
    # autovacuum: named exactly when the server has it off (this machine's CI config does)
    autovacuum_off = _shown(database, "autovacuum") != "on"
    assert any("autovacuum=off" in w for w in warnings) == autovacuum_off
    # in the server's log format: one JSON record per warning, nothing else on the line
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    assert [r["event"] for r in records] == ["postgres_setting"] * len(warnings)
    assert [r["detail"] for r in records] == warnings
    assert {r["level"] for r in records} == {"warning"}


def test_a_database_with_the_settings_on_is_not_warned_about_them(database: str) -> None:
    warnings = asyncio.run(postgres_warnings(Settings(database_url=pg_url(database))))
    assert not any("track_counts" in w for w in warnings)


def test_sqlite_and_an_unreachable_server_give_nothing(tmp_path: Path) -> None:
    assert asyncio.run(postgres_warnings(Settings(database_url=None, var_dir=tmp_path))) == []
    unreachable = "postgresql+asyncpg://postgres@127.0.0.1:1/none"
    assert asyncio.run(postgres_warnings(Settings(database_url=unreachable))) == []
