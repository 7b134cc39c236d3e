"""Start-up GC settings (api/main.py ``settle_heap``; docs/benchmarks.md, "Frozen start-up
heap"): a full collection walked the whole start-up heap (~136,000 objects) and paused the
event loop 100–600 ms under load — the create's longest stalls. ``IDEMPAY_GC_FREEZE`` (on by
default) freezes what is alive once the lifespan has started and thaws it at shutdown;
``IDEMPAY_GC_THRESHOLD`` is set when given; ``IDEMPAY_SWITCH_INTERVAL`` when given, else
0.5 ms on the embedded SQLite (its writer thread and the event loop share the GIL)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from api.config import Settings
from tests.support.asgi import running_app
from tests.support.backend import Backend


def _settings(backend: Backend, tmp_path: Path, **overrides: object) -> Settings:
    return Settings(
        database_url=backend.url,
        var_dir=tmp_path / "var",
        redis_url=None,
        completer_enabled=False,
        **overrides,  # type: ignore[arg-type]
    )


@pytest.fixture
def restore_gc() -> Iterator[None]:
    threshold, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
        sys.setswitchinterval(interval)


@pytest.mark.usefixtures("restore_gc")
async def test_the_lifespan_freezes_the_start_up_heap_and_thaws_it_at_shutdown(
    private_sqlite_backend: Backend, tmp_path: Path
) -> None:
    assert gc.get_freeze_count() == 0
    async with running_app(_settings(private_sqlite_backend, tmp_path)):
        frozen = gc.get_freeze_count()
        # the imported modules, the app and its context: tens of thousands of objects
        assert frozen > 10_000
        assert len(gc.get_objects(generation=2)) < frozen
    assert gc.get_freeze_count() == 0  # another app started in this process starts clean


@pytest.mark.usefixtures("restore_gc")
async def test_gc_freeze_false_leaves_the_heap_alone(
    private_sqlite_backend: Backend, tmp_path: Path
) -> None:
    async with running_app(_settings(private_sqlite_backend, tmp_path, gc_freeze=False)):
        assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("restore_gc")
async def test_the_thresholds_and_the_switch_interval_are_honoured(
    private_sqlite_backend: Backend, tmp_path: Path
) -> None:
    settings = _settings(
        private_sqlite_backend, tmp_path, gc_threshold="5000, 20,30", switch_interval=0.001
    )
    assert settings.gc_thresholds == (5000, 20, 30)
    before = gc.get_threshold(), sys.getswitchinterval()
    async with running_app(settings):
        assert gc.get_threshold() == (5000, 20, 30)
        assert sys.getswitchinterval() == pytest.approx(0.001)
    assert (gc.get_threshold(), sys.getswitchinterval()) == before  # put back at shutdown


def test_the_defaults_keep_pythons_thresholds_and_shorten_the_switch_on_sqlite() -> None:
    sqlite = Settings(database_url="sqlite+aiosqlite:///unused.db")
    assert sqlite.gc_freeze is True
    assert sqlite.gc_thresholds == ()
    assert sqlite.resolved_switch_interval == 0.0005
    postgres = Settings(database_url="postgresql+asyncpg://u@127.0.0.1/unused")
    assert postgres.resolved_switch_interval == 0.0  # Python's own is left alone
    explicit = Settings(database_url="sqlite+aiosqlite:///unused.db", switch_interval=0)
    assert explicit.resolved_switch_interval == 0.0


@pytest.mark.usefixtures("restore_gc")
async def test_sqlite_serves_with_the_short_switch_interval_by_default(
    private_sqlite_backend: Backend, tmp_path: Path
) -> None:
    sys.setswitchinterval(0.005)
    async with running_app(_settings(private_sqlite_backend, tmp_path)):
        assert sys.getswitchinterval() == pytest.approx(0.0005)


@pytest.mark.parametrize("value", ["a,1", "1,2,3,4", "-5", "1.5"])
def test_a_threshold_that_is_not_up_to_three_integers_is_refused(value: str) -> None:
    with pytest.raises(ValidationError, match="gc_threshold"):
        Settings(gc_threshold=value)


def test_the_threshold_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDEMPAY_GC_THRESHOLD", "10000,50")
    monkeypatch.setenv("IDEMPAY_GC_FREEZE", "false")
    settings = Settings()
    assert settings.gc_thresholds == (10000, 50)
    assert settings.gc_freeze is False
