from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.services import SHARED_REDIS, shared_redis_env

__all__ = ["SHARED_REDIS"]  # the redis tests import it from here


@pytest.fixture
def shared_redis() -> Iterator[dict[str, str]]:
    """The machine's Redis with a key prefix private to this test; cleaned up after."""
    with shared_redis_env() as env:
        yield env
