"""UUIDv7 keys (client_sdk/_keys.py)."""

from __future__ import annotations

import time
import uuid

from client_sdk import uuid7


def test_uuid7_has_version_7_rfc_variant_and_the_millisecond_timestamp() -> None:
    key = uuid7(unix_ms=1_795_000_000_123)
    assert key.version == 7
    assert key.variant == uuid.RFC_4122
    assert key.int >> 80 == 1_795_000_000_123
    assert uuid.UUID(str(key)) == key


def test_uuid7_defaults_to_now_and_sorts_by_time() -> None:
    before = time.time_ns() // 1_000_000
    key = uuid7()
    after = time.time_ns() // 1_000_000
    assert before <= key.int >> 80 <= after
    assert str(uuid7(unix_ms=1000)) < str(uuid7(unix_ms=2000))


def test_uuid7_keys_are_unique_even_in_the_same_millisecond() -> None:
    keys = {uuid7(unix_ms=42) for _ in range(10_000)}
    assert len(keys) == 10_000
