"""The SDK's PAN check before journaling (client_sdk/_request.py ``contains_pan``) decides as
the server's (api/pan.py) does — contract §4.12: "A sale the server would refuse
is never accepted offline ... the SDK checks the advice with the server's own rules"; and no
text the server accepts makes the SDK fail with a raw builtin error (§4: typed errors).

Both found at f1dd311 with a real ``Client`` whose server cannot be reached (connection
refused) under an offline policy:
- a PAN as a JSON number with a fraction (``4242424242424242.0``, ``-4242424242424242.0``)
  in ``metadata``: the server answers 422 ``pan_not_allowed`` (its check covers floats), the
  SDK checks only ints and strings — the sale is "approved offline" and the card number is
  written to the terminal's journal;
- 16 × "²" in ``metadata``: ``str.isdigit()`` is true, ``int("²")`` raises — the purchase
  fails with a builtin ``ValueError`` where the server answers 201 (not a PAN)."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.pan import contains_pan as server_contains_pan
from client_sdk import Client, OfflinePolicy, PanNotAllowedError

UNREACHABLE = "http://127.0.0.1:9"  # nothing listens: every connect is refused
POLICY = OfflinePolicy(
    floor_limit=10_000, max_stored_count=10, max_stored_amount=100_000, max_age_s=86_400
)
CARD = {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}


def _offline(journal: Path) -> Client:
    return Client(UNREACHABLE, "sk_unused", terminal_id="T-PAN", journal=journal, offline=POLICY)


@pytest.mark.parametrize("number", [4242424242424242.0, -4242424242424242.0])
def test_a_pan_as_a_float_is_never_sold_offline_nor_journaled(
    tmp_path: Path, number: float
) -> None:
    metadata = {"ref": number}
    assert server_contains_pan(metadata)  # the server would answer 422 pan_not_allowed
    journal = tmp_path / "pos.db"
    with _offline(journal) as pos, pytest.raises(PanNotAllowedError):
        pos.purchase(amount=500, currency="BRL", card=CARD, metadata=metadata, deadline_s=5)
    assert b"4242424242424242" not in journal.read_bytes()


def test_text_the_server_accepts_is_not_refused_with_a_builtin_error(tmp_path: Path) -> None:
    metadata = {"ref": "\u00b2" * 16}
    assert not server_contains_pan(metadata)  # the server answers 201 for it
    with _offline(tmp_path / "pos.db") as pos:
        result = pos.purchase(
            amount=500, currency="BRL", card=CARD, metadata=metadata, deadline_s=5
        )
    assert result.offline
