"""report.html in a real headless Chromium: the charts render, nothing is loaded from the
network, and every exactly-once violation is named with its day and transaction id."""

from __future__ import annotations

import re
import subprocess
from datetime import date
from pathlib import Path

import pytest

from analytics.report import AuditData, render
from tests.support.chromium import FLAGS, ensure_chromium

CHROMIUM_FLAGS = FLAGS


@pytest.fixture(scope="module")
def chromium() -> str:
    return ensure_chromium()


def _fleet(day: str, retry: float, duplicate: float, in_doubt: float) -> dict[str, object]:
    counts = dict.fromkeys(
        ["create_requests", "duplicate_requests", "in_doubt_transactions", "key_reused",
         "aborted", "expired", "reversed", "suspected_double_charges",
         "exactly_once_violations", "retried_transactions", "unseen_attempts"],
        1,
    )  # fmt: skip
    return {
        "event_date": day,
        "merchant_id": "ALL",
        "transactions": 100,
        **counts,
        "retry_rate": retry,
        "link_loss_rate": 0.5,
        "duplicate_rate": duplicate,
        "in_doubt_rate": in_doubt,
        "lookup_found_rate": 0.5,
        "in_doubt_resolution_p95_s": 3.0,
        "create_p95_ms": 120.0,
    }


def _audit() -> AuditData:
    days = ["2026-11-20", "2026-11-21", "2026-11-22"]
    network = {
        "transactions": 50,
        "create_requests": 52,
        "retried_transactions": 2,
        "duplicate_requests": 1,
        "in_doubt_transactions": 3,
    }
    return AuditData(
        start=date(2026, 11, 20),
        end=date(2026, 11, 22),
        daily_summary=[
            _fleet(days[0], 0.01, 0.02, 0.03),
            _fleet(days[1], 0.02, 0.01, 0.05),
            _fleet(days[2], 0.015, 0.0, 0.04),
        ],
        terminal_ranking=[
            {
                "event_date": days[0],
                "merchant_id": "mer_a",
                "terminal_id": "T-0007",
                "transactions": 10,
                "retried_transactions": 3,
                "retry_rate": 0.3,
                "rank": 1,
            },
        ],  # fmt: skip
        suspected_double_charges=[
            {
                "event_date": days[1],
                "merchant_id": "mer_a",
                "terminal_id": "T-0007",
                "card_fingerprint": "ab" * 32,
                "amount": 1250,
                "currency": "BRL",
                "first_transaction_id": "11111111-1111-4111-8111-111111111111",
                "second_transaction_id": "22222222-2222-4222-8222-222222222222",
                "seconds_apart": 12.5,
            },
        ],  # fmt: skip
        exactly_once_violations=[
            {
                "event_date": days[0],
                "merchant_id": "mer_a",
                "transaction_id": "33333333-3333-4333-8333-333333333333",
                "violation": "duplicate_charge",
                "charge_entries": 2,
                "entry_id": None,
            },
            {
                "event_date": days[2],
                "merchant_id": "mer_b",
                "transaction_id": "44444444-4444-4444-8444-444444444444",
                "violation": "charge_without_transaction",
                "charge_entries": 1,
                "entry_id": "e9",
            },
        ],  # fmt: skip
        network_rates=[
            {"event_date": days[0], "network": "gprs", **network},
            {"event_date": days[0], "network": "wifi", **network},
        ],
        # gprs over the range: 3 unseen of 3 + 9 sent → 25 %; wifi: 1 of 1 + 19 → 5 %.
        terminal_link_loss=[
            _link(days[0], "T-0007", "gprs", received=4, unseen=2),
            _link(days[1], "T-0007", "gprs", received=5, unseen=1),
            _link(days[0], "T-0009", "wifi", received=19, unseen=1),
        ],
        # Day 1: 5 of 100 BRL and 1 of 20 USD sold offline (6 of 120: 5 %), 2 of them
        # declined (1/3); day 2: none; day 3: no transaction at all (0 %).
        offline_summary=[
            _offline(days[0], "BRL", transactions=100, offline=5, declined=1),
            _offline(days[0], "USD", transactions=20, offline=1, declined=1),
            _offline(days[1], "BRL", transactions=50, offline=0, declined=0),
        ],
        offline_terminals=[
            {
                **_offline(days[0], "BRL", transactions=9, offline=5, declined=1),
                "merchant_id": "mer_a",
                "terminal_id": "T-0042",
            },
        ],  # fmt: skip
        duplicate_guard=[
            {
                "event_date": days[0],
                "merchant_id": "mer_a",
                "duplicates_blocked": 3,
                "duplicates_overridden": 1,
            },
            {
                "event_date": days[0],
                "merchant_id": "ALL",
                "duplicates_blocked": 3,
                "duplicates_overridden": 1,
            },
        ],  # fmt: skip
    )


def _offline(
    day: str, currency: str, *, transactions: int, offline: int, declined: int
) -> dict[str, object]:
    return {
        "event_date": day,
        "merchant_id": "ALL",
        "currency": currency,
        "transactions": transactions,
        "offline_transactions": offline,
        "offline_rate": offline / transactions,
        "forward_delay_p50_s": 60.0 if offline else None,
        "forward_delay_p95_s": 600.0 if offline else None,
        "forward_delay_max_s": 3600.0 if offline else None,
        "offline_declined": declined,
        "offline_decline_rate": declined / offline if offline else 0.0,
        "offline_amount_at_risk": 1250 * declined,
        "forwarded_after_day_end": 1 if offline else 0,
    }


def _link(
    day: str, terminal: str, network: str, *, received: int, unseen: int
) -> dict[str, object]:
    return {
        "event_date": day,
        "merchant_id": "mer_a",
        "terminal_id": terminal,
        "network": network,
        "transactions": received,
        "received_attempts": received,
        "unseen_attempts": unseen,
        "link_loss_rate": unseen / (unseen + received),
    }


def test_report_renders_offline_in_chromium(chromium: str, tmp_path: Path) -> None:
    html = render(_audit())
    assert not re.search(r"https?://", html), "the report must not reference any URL"
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    dom = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "<svg" in dom and "</body>" in dom
    trend = re.search(r'<div class="charts" id="trend">(.*?)</div>', dom, flags=re.S)
    assert trend is not None
    # Four trend charts (retry, link loss, duplicate, in-doubt), one point per day each, at
    # the values given: 1.0 %, 2.0 %, 1.5 % for the retry rate, 50 % link loss every day.
    assert trend.group(1).count("<svg") == 4
    points = re.findall(
        r'<circle class="point"[^>]*data-date="([\d-]+)" data-value="([\d.]+)"', trend[1]
    )
    assert len(points) == 12
    assert points[:6] == [
        ("2026-11-20", "0.010000"),
        ("2026-11-21", "0.020000"),
        ("2026-11-22", "0.015000"),
        ("2026-11-20", "0.500000"),
        ("2026-11-21", "0.500000"),
        ("2026-11-22", "0.500000"),
    ]
    polylines = re.findall(r'<polyline class="series" points="([^"]+)"', trend[1])
    assert len(polylines) == 4 and all(len(p.split()) == 3 for p in polylines)
    networks = re.search(r'<div class="charts" id="networks">(.*?)</div>', dom, flags=re.S)
    assert networks is not None
    bars = re.findall(r'<rect class="point bar[^"]*"[^>]*data-group="(\w+)"', networks[1])
    assert sorted(set(bars)) == ["gprs", "wifi"] and len(bars) == 6  # 3 rates × 2 networks
    # Link loss by network over the range, recomputed from the terminals' counts.
    loss = re.search(r'<div class="charts" id="link-loss">(.*?)</div>', dom, flags=re.S)
    assert loss is not None
    assert re.findall(r'data-group="(\w+)" data-series="link loss" data-value="([\d.]+)"',
                      loss[1]) == [("gprs", "0.250000"), ("wifi", "0.050000")]  # fmt: skip
    lossiest = dom.split("Lossiest links", 1)[1].split("</table>", 1)[0]
    assert re.findall(r"<td[^>]*>(T-\d+)</td>", lossiest) == ["T-0007", "T-0009"]
    assert "25.00%" in lossiest and "5.00%" in lossiest
    # Offline selling: the fleet's offline and offline-decline rates per day, over both
    # currencies, 0 on a day without transactions; the top terminal; the guard's counts.
    offline = re.search(r'<div class="charts" id="offline">(.*?)</div>', dom, flags=re.S)
    assert offline is not None and offline[1].count("<svg") == 2
    assert re.findall(r'data-date="([\d-]+)" data-value="([\d.]+)"', offline[1]) == [
        ("2026-11-20", "0.050000"),
        ("2026-11-21", "0.000000"),
        ("2026-11-22", "0.000000"),
        ("2026-11-20", "0.333333"),
        ("2026-11-21", "0.000000"),
        ("2026-11-22", "0.000000"),
    ]
    selling = dom.split("<h2>Offline selling</h2>", 1)[1].split("<h2>", 1)[0]
    assert "cannot count" in selling
    terminals = selling.split("Terminals selling offline", 1)[1]
    assert re.findall(r"<td[^>]*>([^<]*)</td>", terminals) == [
        "T-0042", "BRL", "5", "1", "1,250", "1", "3,600.0"
    ]  # fmt: skip
    guard = re.search(r'<div id="duplicate-guard">(.*?)</div>', dom, flags=re.S)
    assert guard is not None
    assert re.findall(r"<td[^>]*>(\d+)</td>", guard[1]) == ["3", "1"]
    banner = re.search(r'<div class="banner bad" id="exactly-once">(.*?)</div>', dom, re.S)
    assert banner is not None
    assert "2 exactly-once violations" in banner.group(1)
    for day, transaction_id in [
        ("2026-11-20", "33333333-3333-4333-8333-333333333333"),
        ("2026-11-22", "44444444-4444-4444-8444-444444444444"),
    ]:
        assert re.search(rf"{day}[^<]*<[^>]*>[^<]*</code>[^<]*<code>{transaction_id}", banner[1])
    assert "22222222-2222-4222-8222-222222222222" in dom  # the suspect is listed
    assert not re.search(r"https?://", dom)


def test_report_without_violations_says_so(tmp_path: Path) -> None:
    audit = _audit()
    audit.exactly_once_violations = []
    html = render(audit)
    assert 'class="banner ok"' in html and "0 exactly-once violations" in html
    assert 'class="banner bad"' not in html
