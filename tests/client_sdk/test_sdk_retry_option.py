"""``retry=RetryPolicy(...)`` on ``Client`` and ``AsyncClient``, and the deprecated loose
``base_backoff`` / ``max_backoff`` / ``max_retries`` arguments it replaces (one release)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fake_idempay import FakeClock, FakeIdempay

from client_sdk import AsyncClient, Client, NotFoundError, RetryPolicy

MakeClient = Callable[..., Client]
UNKNOWN = "01a1ee56-5e00-7d97-86ac-d904da6cff77"


def test_the_default_policy_is_retry_policy_defaults(make_client: MakeClient) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        client = make_client()
    assert client.retry == RetryPolicy()
    assert client.max_retries == RetryPolicy().max_retries


def test_retry_governs_the_waits_and_the_single_call_retries(
    make_client: MakeClient, fake: FakeIdempay, clock: FakeClock
) -> None:
    client = make_client(retry=RetryPolicy(base=0.25, cap=0.25, max_retries=4))
    fake.inject("lookup", *["lost_in_network"] * 4)
    with pytest.raises(NotFoundError):
        client.lookup(UNKNOWN)
    assert len([w for w in fake.wire if w.endpoint == "lookup"]) == 5
    assert len(clock.sleeps) == 4 and all(0 < s <= 0.25 for s in clock.sleeps)


@pytest.mark.parametrize(
    ("loose", "expected"),
    [
        ({"base_backoff": 0.5}, RetryPolicy(base=0.5)),
        ({"max_backoff": 1.0}, RetryPolicy(cap=1.0)),
        ({"max_retries": 0}, RetryPolicy(max_retries=0)),
        (
            {"base_backoff": 0.02, "max_backoff": 0.2, "max_retries": 5},
            RetryPolicy(base=0.02, cap=0.2, max_retries=5),
        ),
    ],
)
def test_the_loose_arguments_still_work_but_warn(
    make_client: MakeClient, loose: dict[str, Any], expected: RetryPolicy
) -> None:
    with pytest.warns(DeprecationWarning, match="retry=RetryPolicy") as caught:
        client = make_client(**loose)
    assert client.retry == expected
    assert all(name in str(caught[0].message) for name in loose)


def test_the_warning_points_at_the_caller(tmp_path: Path, fake: FakeIdempay) -> None:
    with pytest.warns(DeprecationWarning) as caught:
        client = Client(
            "http://t", "k", terminal_id="T", journal=tmp_path / "a.db", max_backoff=1.0
        )
    client.close()
    assert caught[0].filename == __file__


@pytest.mark.parametrize("loose", [{"base_backoff": 0.1}, {"max_retries": 2}])
def test_retry_and_a_loose_argument_together_are_refused(
    tmp_path: Path, loose: dict[str, Any]
) -> None:
    for client_type in (Client, AsyncClient):
        with pytest.raises(TypeError, match="not both"):
            client_type(
                "http://t",
                "k",
                terminal_id="T",
                journal=tmp_path / "pos.db",
                retry=RetryPolicy(),
                **loose,
            )


def test_retry_must_be_a_policy(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="RetryPolicy"):
        Client("http://t", "k", terminal_id="T", journal=tmp_path / "p.db", retry=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("loose", "name"),
    [
        ({"base_backoff": -1.0}, "base_backoff"),
        ({"max_backoff": float("inf")}, "max_backoff"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": 1.5}, "max_retries"),
    ],
)
def test_bad_loose_values_are_refused_by_their_own_name(
    tmp_path: Path, loose: dict[str, Any], name: str
) -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match=name):
        Client("http://t", "k", terminal_id="T", journal=tmp_path / "p.db", **loose)


async def test_the_async_client_takes_the_same_option(tmp_path: Path) -> None:
    policy = RetryPolicy(base=0.2, cap=2.0, max_retries=1)
    async with AsyncClient(
        "http://t", "k", terminal_id="T", journal=tmp_path / "p.db", retry=policy
    ) as pos:
        assert pos.retry is policy
    with pytest.warns(DeprecationWarning):
        legacy = AsyncClient(
            "http://t", "k", terminal_id="T", journal=tmp_path / "q.db", max_retries=1
        )
    assert legacy.retry == RetryPolicy(max_retries=1)
    await legacy.close()
