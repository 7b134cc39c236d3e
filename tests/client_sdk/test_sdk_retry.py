"""Backoff and Retry-After arithmetic (client_sdk/_retry.py)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from client_sdk._retry import RetryPolicy, backoff, parse_retry_after

NOW = datetime(2026, 11, 20, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("attempt", "ceiling"),
    [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (6, 3.2), (7, 5.0), (50, 5.0), (10_000, 5.0)],
)
def test_backoff_is_full_jitter_under_an_exponential_capped_ceiling(
    attempt: int, ceiling: float
) -> None:
    rng = random.Random(1)
    waits = [backoff(attempt, base=0.1, cap=5.0, rng=rng) for _ in range(500)]
    assert all(0.0 <= w <= ceiling for w in waits)
    assert max(waits) > ceiling * 0.9  # full jitter spans the whole range
    assert min(waits) < ceiling * 0.1


def test_backoff_replays_with_the_same_seed() -> None:
    first = [backoff(n, base=0.1, cap=5.0, rng=random.Random(3)) for n in range(1, 9)]
    again = [backoff(n, base=0.1, cap=5.0, rng=random.Random(3)) for n in range(1, 9)]
    assert first == again


def test_backoff_attempts_start_at_one() -> None:
    with pytest.raises(ValueError):
        backoff(0, base=0.1, cap=5.0, rng=random.Random(0))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("3", 3.0),
        ("0", 0.0),
        (" 2 ", 2.0),
        ("1.5", 1.5),
        (format_datetime(NOW + timedelta(seconds=30), usegmt=True), 30.0),
        (format_datetime(NOW - timedelta(seconds=30), usegmt=True), 0.0),
        ("Fri, 20 Nov 2026 12:00:07 GMT", 7.0),
        ("soon", None),
        ("", None),
        ("-1", None),
        ("inf", None),
        ("nan", None),
        ("Fri, 99 Nov 2026 12:00:07 GMT", None),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, NOW) == expected


def test_policy_prefers_retry_after_clamped_and_falls_back_to_backoff() -> None:
    policy = RetryPolicy(base=0.1, cap=5.0, max_retry_after=60.0)
    rng = random.Random(0)
    assert policy.wait(1, 2.0, rng) == 2.0
    assert policy.wait(1, 3600.0, rng) == 60.0
    assert 0.0 <= policy.wait(3, None, rng) <= 0.4


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        ({"base": -0.1}, "base"),
        ({"base": float("nan")}, "base"),
        ({"cap": float("inf")}, "cap"),
        ({"cap": 601.0}, "cap"),
        ({"max_retry_after": -1.0}, "max_retry_after"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": 2.0}, "max_retries"),
        ({"max_retries": True}, "max_retries"),
    ],
)
def test_policy_settings_are_validated(settings: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        RetryPolicy(**settings)


def test_policy_is_frozen_and_compares_by_value() -> None:
    assert RetryPolicy(base=0.2) == RetryPolicy(base=0.2)
    with pytest.raises(AttributeError):
        RetryPolicy().base = 1.0  # type: ignore[misc]
