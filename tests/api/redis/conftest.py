from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.services import RedisServer, clean_redis_prefix, shared_redis_prefix

SHARED_REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, so it can be killed and flushed freely."""
    server = RedisServer(tmp_path).start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def shared_redis() -> Iterator[dict[str, str]]:
    """The machine's Redis with a key prefix private to this test; cleaned up after."""
    prefix = shared_redis_prefix()
    try:
        yield {"IDEMPAY_REDIS_URL": SHARED_REDIS, "IDEMPAY_REDIS_PREFIX": prefix}
    finally:
        clean_redis_prefix(SHARED_REDIS, prefix)
