"""docs/contract.md is kept in step with the code: every error code it lists is one the
server renders, every code the server renders is listed, and every audit metric it defines
is an output column."""

from __future__ import annotations

import re
from pathlib import Path

from analytics.metrics import METRIC_COLUMNS, NETWORK_COLUMNS
from api.errors import TITLES

CONTRACT = (Path(__file__).resolve().parents[1] / "docs" / "contract.md").read_text()

# Codes of the HTTP layer and the catch-all: rendered by the server, not part of a
# transaction endpoint's table.
_TRANSPORT_CODES = {
    "method_not_allowed",
    "internal_error",
    "request_headers_too_large",
    "malformed_request",
    "http_error",
}


def _section(title: str) -> str:
    start = CONTRACT.index(title)
    following = CONTRACT.find("\n## ", start + len(title))
    return CONTRACT[start : following if following != -1 else None]


def _first_column(table_text: str) -> list[str]:
    names = []
    for line in table_text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 1 and cells[0] not in {"metric", ""} and not set(cells[0]) <= {"-"}:
            names.append(cells[0])
    return names


def _documented_codes() -> set[str]:
    return set(re.findall(r"`([a-z_]+)`", _section("## §2 HTTP API")))


def test_every_documented_error_code_is_rendered_by_the_server() -> None:
    table_codes = set(re.findall(r"\| [45]\d\d \| `([a-z_]+)` \|", CONTRACT))
    assert {"clock_skew", "idempotency_key_reused", "request_expired"} <= table_codes
    missing = sorted(table_codes - set(TITLES))
    assert not missing, f"in docs/contract.md but unknown to api/errors.py: {missing}"


def test_every_code_the_server_renders_is_in_the_contract() -> None:
    undocumented = sorted(set(TITLES) - _TRANSPORT_CODES - _documented_codes())
    assert not undocumented, f"rendered by the server but not in docs/contract.md: {undocumented}"


def test_every_audit_metric_is_an_output_column() -> None:
    metrics = _first_column(_section("### §5.2 Daily audit").split("Rates are fractions")[0])
    assert "exactly_once_violations" in metrics and len(metrics) >= 20
    missing = sorted(set(metrics) - set(METRIC_COLUMNS))
    assert not missing, f"defined in docs/contract.md but not in daily_summary: {missing}"


def test_network_rates_carry_the_link_loss_columns() -> None:
    for column in ("unseen_attempts", "link_loss_rate", "lookup_found_rate"):
        assert column in NETWORK_COLUMNS
