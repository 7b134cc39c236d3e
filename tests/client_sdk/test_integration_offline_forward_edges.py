"""Store and forward against the real server, on Postgres and SQLite: three edges a hostile
review reproduced with real processes (contract §4.12).

- A sale the server can never accept (brand ``"Visa"``, ``installments=25``, 5 KiB of
  metadata) is refused offline exactly as online — ``validation_error``, nothing stored —
  and a stored advice the server refuses as invalid ends ``reported``, never ``stored``
  forever (where it would block every offline sale once past ``max_age_s``).
- One advice the issuer never answers (202) holds back nothing: the sales stored behind it
  are forwarded in the same pass.
- A server offset learned for a clock that was corrected since (the clock stepped, or the
  terminal rebooted) is dropped before stamping: an offline sale is not stamped days ahead;
  a stored sale refused ``clock_skew`` is re-stamped once with proof, whatever its stamp.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from integration_db import Merchant
from test_integration_offline import Link

import client_sdk._base_client as base_client
from client_sdk import (
    Client,
    IdempayError,
    JournalState,
    OfflinePolicy,
    RetryPolicy,
    ValidationFailedError,
)
from tests.support.backend import Backend
from tests.support.client import Api
from tests.support.services import Server

CARD = {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}
POLICY = OfflinePolicy(
    floor_limit=5000, max_stored_count=5, max_stored_amount=20_000, max_age_s=600
)
DAYS_3 = 3 * 86_400.0


def terminal(url: str, api_key: str, journal: Path, link: Link, **options: Any) -> Client:
    return Client(
        url,
        api_key,
        terminal_id=options.pop("terminal_id", "T-EDGE"),
        journal=journal,
        transport=link,
        timeout=5.0,
        retry=RetryPolicy(base=0.02, cap=0.2),
        offline=options.pop("offline", POLICY),
        **options,
    )


def parse(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# ---- a sale the server can never accept ------------------------------------------------------

INVALID_SALES: dict[str, dict[str, Any]] = {
    "brand": {"card": {**CARD, "brand": "Visa"}},
    "installments": {"installments": 25},
    "metadata": {"metadata": {"note": "x" * 5 * 1024}},
}


@pytest.mark.parametrize("why", sorted(INVALID_SALES))
def test_a_sale_the_server_would_refuse_is_refused_offline_too_and_never_stored(
    backend: Backend, server: Server, tmp_path: Path, why: str
) -> None:
    merchant = Merchant.create(backend, f"invalid-{why}-{uuid.uuid4().hex[:8]}")
    sale = {"amount": 1000, "currency": "BRL", "card": CARD, **INVALID_SALES[why]}
    link = Link()
    try:
        with terminal(server.url, merchant.api_key, tmp_path / "pos.db", link) as pos:
            with pytest.raises(ValidationFailedError) as online:
                pos.purchase(**sale, deadline_s=30)
            assert online.value.code == "validation_error"  # the server's own verdict
            link.down = True
            with pytest.raises(ValidationFailedError) as offline:
                pos.purchase(**sale, deadline_s=30)
            assert offline.value.code == "validation_error"
            assert pos.journal.stored() == [] and pos.journal.offline_exposure().count == 0
            ended = [e.state for e in pos.journal.entries()]
            assert ended == [JournalState.RESOLVED, JournalState.RESOLVED]  # online, offline
            still = pos.purchase(amount=1000, currency="BRL", card=CARD, deadline_s=30)
            assert still.offline  # a valid sale is still sold offline
        assert merchant.key_states() == {}  # nothing of the invalid sale reached the server
    finally:
        link.close()


def test_a_stored_advice_the_server_refuses_as_invalid_ends_reported(
    backend: Backend, server: Server, tmp_path: Path
) -> None:
    """An advice stored before the SDK validated offline sales (an older SDK wrote it): the
    server answers 422 validation_error; the entry ends REPORTED with that error, told to
    the application, and no longer counts against the offline limits."""
    merchant = Merchant.create(backend, f"invalid-stored-{uuid.uuid4().hex[:8]}")
    told: list[IdempayError] = []
    link = Link()
    link.down = True
    try:
        with terminal(
            server.url,
            merchant.api_key,
            tmp_path / "pos.db",
            link,
            offline=OfflinePolicy(
                floor_limit=5000, max_stored_count=5, max_stored_amount=20_000, max_age_s=1
            ),
            on_offline_error=told.append,
        ) as pos:
            bad = pos.purchase(amount=1000, currency="BRL", card=CARD, deadline_s=30)
            assert bad.offline
            entry = pos.journal.get(bad.id)
            assert entry is not None
            invalid = entry.request_json.replace('"brand":"visa"', '"brand":"Visa"')
            with pos.journal._open():  # as an SDK without the shared rules stored it
                pos.journal._db.execute(
                    "UPDATE journal_entry SET request = ? WHERE key = ?", (invalid, bad.id)
                )
            time.sleep(1.2)  # past max_age_s: it blocks offline selling while it is stored
            link.down = False
            [result] = pos.forward()
            assert result.key == bad.id and result.state is JournalState.REPORTED
            assert isinstance(result.error, ValidationFailedError)
            assert result.error.code == "validation_error"
            assert [e.code for e in told] == ["validation_error"]
            assert pos.forward() == [] and pos.journal.stored() == []
            link.down = True
            again = pos.purchase(amount=1000, currency="BRL", card=CARD, deadline_s=30)
            assert again.offline  # nothing overdue blocks offline selling any more
        assert bad.id not in merchant.key_states()
    finally:
        link.close()


# ---- one stuck advice holds back nothing -----------------------------------------------------


def test_an_advice_the_issuer_never_answers_holds_back_nothing_behind_it(
    backend: Backend, server: Server, tmp_path: Path
) -> None:
    merchant = Merchant.create(backend, f"stuck-{uuid.uuid4().hex[:8]}")
    link = Link()
    link.down = True
    try:
        with terminal(server.url, merchant.api_key, tmp_path / "pos.db", link) as pos:
            down = {**CARD, "token": "tok_issuer_down"}
            stuck = pos.purchase(amount=1000, currency="BRL", card=down, deadline_s=30)
            behind = [
                pos.purchase(amount=amount, currency="BRL", card=CARD, deadline_s=30)
                for amount in (1100, 1200)
            ]
            assert stuck.offline and all(sale.offline for sale in behind)
            link.down = False
            results = {r.key: r for r in pos.forward()}
            for sale in behind:
                assert results[sale.id].state is JournalState.RESOLVED, results[sale.id].error
            assert results[stuck.id].state is JournalState.STORED  # the server finishes it
            assert pos.journal.get(stuck.id).state is JournalState.STORED  # type: ignore[union-attr]
            assert [r.key for r in pos.forward()] == [stuck.id]  # looked up again, still 202
        assert merchant.transactions() == {sale.id: "approved" for sale in behind}
        assert merchant.charges() == {sale.id: 1 for sale in behind}
        assert merchant.key_states()[stuck.id] == "processing"  # an advice is never fenced
    finally:
        link.close()


# ---- a stale offset after the device clock was corrected -------------------------------------


class DeviceClock:
    """The terminal's wall clock, ``behind`` seconds slow until it is corrected."""

    def __init__(self, behind: float) -> None:
        self.behind = behind

    def __call__(self) -> float:
        return time.time() - self.behind


def learn_while_behind(url: str, merchant: Merchant, journal: Path, link: Link) -> None:
    clock = DeviceClock(DAYS_3)
    with terminal(url, merchant.api_key, journal, link, clock=clock) as pos:
        assert not pos.purchase(amount=900, currency="BRL", card=CARD, deadline_s=30).offline
        assert pos.clock_offset_s is not None and pos.clock_offset_s > DAYS_3 - 5
        assert pos.journal.clock_offset() is not None  # kept for the next process


def sell_offline_then_forward(url: str, merchant: Merchant, journal: Path, link: Link) -> None:
    clock = DeviceClock(0.0)  # corrected
    link.down = True
    with terminal(url, merchant.api_key, journal, link, clock=clock) as pos:
        sold = pos.purchase(amount=1000, currency="BRL", card=CARD, deadline_s=30)
        assert sold.offline
        entry = pos.journal.get(sold.id)
        assert entry is not None
        assert abs(parse(entry.request["captured_at"]) - time.time()) < 60, entry.request
        link.down = False
        [result] = pos.forward()
        assert (result.key, result.state) == (sold.id, JournalState.RESOLVED), result.error
    assert merchant.transactions()[sold.id] == "approved"
    assert merchant.charges()[sold.id] == 1


def test_an_offset_learned_before_the_clock_was_stepped_is_not_used_to_stamp(
    backend: Backend, server: Server, tmp_path: Path
) -> None:
    """Same boot: the clock 3 days behind teaches +3 days; the clock is corrected (a step:
    the wall clock moved against the monotonic one); a new process, link down: the sale is
    stamped on the corrected device clock, not 72 h ahead, and forwarded at once."""
    merchant = Merchant.create(backend, f"stepped-{uuid.uuid4().hex[:8]}")
    link = Link()
    try:
        learn_while_behind(server.url, merchant, tmp_path / "pos.db", link)
        sell_offline_then_forward(server.url, merchant, tmp_path / "pos.db", link)
    finally:
        link.close()


def test_an_offset_kept_across_a_reboot_is_relearned_before_stamping(
    backend: Backend, server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    merchant = Merchant.create(backend, f"rebooted-{uuid.uuid4().hex[:8]}")
    link = Link()
    try:
        learn_while_behind(server.url, merchant, tmp_path / "pos.db", link)
        other_boot = tmp_path / "boot_id"
        other_boot.write_text(f"{uuid.uuid4()}\n")
        monkeypatch.setattr(base_client, "BOOT_ID_PATH", str(other_boot))  # rebooted
        sell_offline_then_forward(server.url, merchant, tmp_path / "pos.db", link)
    finally:
        link.close()


def test_an_offset_is_dropped_when_the_clock_steps_while_the_client_runs(
    backend: Backend, server: Server, tmp_path: Path
) -> None:
    merchant = Merchant.create(backend, f"step-live-{uuid.uuid4().hex[:8]}")
    clock = DeviceClock(DAYS_3)
    link = Link()
    try:
        with terminal(server.url, merchant.api_key, tmp_path / "pos.db", link, clock=clock) as pos:
            assert not pos.purchase(amount=900, currency="BRL", card=CARD, deadline_s=30).offline
            clock.behind = 0.0  # NTP steps the clock while the terminal runs
            link.down = True
            sold = pos.purchase(amount=1000, currency="BRL", card=CARD, deadline_s=30)
            entry = pos.journal.get(sold.id)
            assert entry is not None and sold.offline
            assert abs(parse(entry.request["captured_at"]) - time.time()) < 60, entry.request
            link.down = False
            [result] = pos.forward()
            assert result.state is JournalState.RESOLVED, result.error
    finally:
        link.close()


def test_a_stored_sale_refused_for_clock_skew_is_restamped_once_whatever_its_stamp(
    backend: Backend, tmp_path: Path
) -> None:
    """Stored while the offset was known (a UUIDv7 key on the server's clock) but with a
    ``captured_at`` an hour ahead: refused clock_skew, looked up (404), re-stamped once with
    the sale's time on the server's clock (the monotonic time since it was stored), and
    processed under the same key."""
    server = backend.server(IDEMPAY_CLOCK_SKEW_TOLERANCE="5s")
    merchant = Merchant.create(backend, f"restamp-known-{uuid.uuid4().hex[:8]}")
    link = Link()
    try:
        with terminal(server.url, merchant.api_key, tmp_path / "pos.db", link) as pos:
            assert not pos.purchase(amount=900, currency="BRL", card=CARD, deadline_s=30).offline
            link.down = True
            ahead = datetime.now(UTC) + timedelta(hours=1)
            sold = pos.purchase(
                amount=1000, currency="BRL", card=CARD, deadline_s=30, captured_at=ahead
            )
            assert sold.offline and uuid.UUID(sold.id).version == 7
            stored = pos.journal.get(sold.id)
            assert stored is not None and stored.outcome is not None
            assert stored.outcome["clock"]["offset_known"] is True
            link.down = False
            [result] = pos.forward()
            assert result.state is JournalState.RESOLVED, result.error
            entry = pos.journal.get(sold.id)
            assert entry is not None and entry.outcome is not None
            restamp = entry.outcome["restamped"]
            assert abs(parse(restamp["to"]) - time.time()) < 60
        assert merchant.transactions()[sold.id] == "approved"
        events = merchant.create_events_of_a_retry(sold.id)
        assert events == [("rejected", 422), ("created", 201)]
        assert Api(server.url, merchant.api_key).lookup(sold.id).json()["offline"] is True
    finally:
        server.stop()
        link.close()
