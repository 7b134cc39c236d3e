from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.services import clean_redis_prefix, shared_redis_prefix

SHARED_REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture
def shared_redis() -> Iterator[dict[str, str]]:
    """The machine's Redis with a key prefix private to this test; cleaned up after."""
    prefix = shared_redis_prefix()
    try:
        yield {"IDEMPAY_REDIS_URL": SHARED_REDIS, "IDEMPAY_REDIS_PREFIX": prefix}
    finally:
        clean_redis_prefix(SHARED_REDIS, prefix)
