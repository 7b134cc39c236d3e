"""The SDK reads ``Retry-After`` and ``Date`` strictly: only ASCII digits are a number
(``float()`` and the e-mail date parser's ``int()`` also take "١٢", "1e3", "+5", "1_0"),
and an HTTP-date is always UTC — a date whose zone the parser did not find is not read in
the terminal's local time zone."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from client_sdk import Client
from client_sdk._retry import parse_http_date, parse_retry_after

NOW = datetime(2026, 11, 20, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "value",
    [
        "\u0661\u0662",  # Arabic-Indic 12
        "\uff15",  # fullwidth 5
        "1e3",
        "+5",
        "1_0",
        "0x10",
        "\u00b2",
        "5\x00",
        "Fri, \u0662\u0660 Nov 2026 12:00:07 GMT",  # a date with non-ASCII digits
        "Fri, 20 Nov 2026 12:00:07 GMT\x00",
    ],
)
def test_retry_after_that_is_not_ascii_is_not_a_delay(value: str) -> None:
    assert parse_retry_after(value, NOW) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("3", 3.0),
        ("\t3 ", 3.0),
        ("1.5", 1.5),
        ("Fri, 20 Nov 2026 12:00:07 GMT", 7.0),
        ("Friday, 20-Nov-26 12:00:07 GMT", 7.0),  # RFC 850, still an HTTP-date
        ("Fri Nov 20 12:00:07 2026", 7.0),  # asctime: no zone, and it means GMT
    ],
)
def test_retry_after_forms_still_read(value: str, expected: float) -> None:
    assert parse_retry_after(value, NOW) == expected


@given(st.text(max_size=40))
def test_retry_after_never_raises_and_is_never_negative(value: str) -> None:
    seconds = parse_retry_after(value, NOW)
    assert seconds is None or seconds >= 0


@given(st.text(max_size=40))
def test_http_date_is_none_or_aware(value: str) -> None:
    when = parse_http_date(value)
    assert when is None or when.tzinfo is not None


@pytest.fixture
def far_west_local_time() -> Iterator[None]:
    """The terminal's local time zone 10 hours behind UTC."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "Etc/GMT+10"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()


@pytest.mark.parametrize("zone", ["-0000", "GMT\x00"])
def test_a_date_without_a_zone_the_parser_knows_is_utc_not_local_time(
    tmp_path: Path, far_west_local_time: None, zone: str
) -> None:
    def handle(_request: httpx.Request) -> httpx.Response:
        date = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
        date = date.replace("GMT", zone)
        return httpx.Response(200, json={}, headers={"Date": date, "X-Request-Id": "r1"})

    with Client("http://idempay.test", "idp_test", terminal_id="T-1", journal=tmp_path / "p.db",
                transport=httpx.MockTransport(handle)) as pos:  # fmt: skip
        sent_at = time.time()
        pos._observe_clock(pos._http.get("/healthz"), sent_at)
        offset = pos.clock_offset_s
    assert offset is None or abs(offset - 120) < 3
    if zone == "-0000":  # RFC 5322: -0000 is UTC with no local offset known
        assert offset is not None


def test_a_date_with_non_ascii_digits_is_not_the_servers_clock(tmp_path: Path) -> None:
    def handle(_request: httpx.Request) -> httpx.Response:
        date = format_datetime(datetime.now(UTC) + timedelta(days=1), usegmt=True)
        day = date[5:7]
        date = date.replace(day, "".join(chr(0x0660 + int(d)) for d in day), 1)
        return httpx.Response(200, json={}, headers={"Date": date.encode(), "X-Request-Id": "r1"})

    with Client("http://idempay.test", "idp_test", terminal_id="T-1", journal=tmp_path / "p.db",
                transport=httpx.MockTransport(handle)) as pos:  # fmt: skip
        before = pos.clock_offset_s
        pos._observe_clock(pos._http.get("/healthz"), time.time())
        assert pos.clock_offset_s == before
