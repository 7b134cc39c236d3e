"""Store and forward when the terminal's clock is wrong or the link is a black hole
(contract §4.11–§4.12, review of issue 16):

- a refusal about one stored entry (``clock_skew``, a 4xx about its body) never holds back
  the entries behind it; only the link down stops a forward pass;
- every stored entry is age-checked, on the SDK's own record of when it was stored, so an
  entry stamped in the future cannot dodge ``max_age_s``;
- the learned server offset is kept in the journal: a reboot while offline stamps
  corrected times;
- an advice stamped on an uncorrected clock (no offset known: booted offline) is re-stamped
  once, after a refusal that stores nothing AND a 404 lookup, under the same key — never a
  new key, and recorded in the journal;
- on a black-hole link the terminal pays one full connect timeout, not one per attempt.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_idempay import API_KEY, CARD, FakeClock, FakeIdempay, Seen, _problem, _transaction
from offline_world import World, parse_time

from client_sdk import (
    AdviceTooOldError,
    Client,
    ClockSkewError,
    Journal,
    JournalState,
    OfflineLimitError,
    OfflinePolicy,
    StoredPaymentOverdueError,
)

POLICY = OfflinePolicy(floor_limit=5000, max_stored_count=5, max_stored_amount=20000, max_age_s=10)
DAY = 86_400.0


def world_client(world: World, journal: Path, **overrides: Any) -> Client:
    options: dict[str, Any] = {
        "terminal_id": "T-0001",
        "journal": journal,
        "transport": world.transport(),
        "seed": 7,
        "clock": world.clock,
        "monotonic": world.clock,
        "sleep": world.sleep,
        "abort_grace_s": 5.0,
        "timeout": 3.0,
        "offline": POLICY,
    }
    options.update(overrides)
    return Client("http://idempay.test", API_KEY, **options)


def sell(pos: Client, amount: int = 1000) -> Any:
    return pos.purchase(amount=amount, currency="BRL", card=CARD, deadline_s=30)


# ---- 1. head of line -------------------------------------------------------------------


def test_a_stuck_advice_does_not_hold_back_the_stored_sales_behind_it(
    fake: FakeIdempay, make_client: Any
) -> None:
    """The first stored sale is refused ``clock_skew`` every time (the fake never teaches
    the clock, so no re-stamp is possible): it stays STORED, reported with the server's
    error, and the sale behind it is forwarded in the same pass."""
    stuck: list[str] = []

    def refuse_the_stuck_key(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.headers.get("idempotency-key") in stuck:
            fake.seen.append(Seen("create", "POST", request.url.path, {}, None))
            return _problem(422, "clock_skew", status_header="not_found")
        return fake.handle(request)

    pos = make_client(offline=POLICY, transport=httpx.MockTransport(refuse_the_stuck_key))
    fake.down = True
    first, behind = sell(pos), sell(pos, 1100)
    stuck.append(first.id)
    fake.down = False
    results = {r.key: r for r in pos.forward()}
    assert results[behind.id].state is JournalState.RESOLVED, results[behind.id].error
    assert results[first.id].state is JournalState.STORED
    assert isinstance(results[first.id].error, ClockSkewError)
    assert fake.processed[behind.id] == 1 and fake.processed[first.id] == 0
    # refused once, looked up (404: nothing under the key) — not resent in a loop
    about_first = [c.endpoint for c in fake.seen if first.id in c.path or c.body is None]
    assert about_first == ["create", "lookup"]


def test_only_the_link_down_stops_the_pass(fake: FakeIdempay, make_client: Any) -> None:
    pos = make_client(offline=POLICY)
    fake.down = True
    first, second = sell(pos), sell(pos, 1100)
    before = len(fake.wire)
    results = pos.forward()
    assert [r.state for r in results] == [JournalState.STORED, JournalState.STORED]
    assert len(fake.wire) == before + 1  # the second one is not tried: the link is down
    assert {r.key for r in results} == {first.id, second.id}


# ---- 1b. age of every entry, measured on the SDK's own record ----------------------------


def test_every_stored_entry_is_age_checked_and_a_future_stamp_cannot_dodge_it(
    fake: FakeIdempay, make_client: Any, clock: FakeClock
) -> None:
    """Two stored sales, the first captured 90 s in the future (a clock that ran ahead):
    past ``max_age_s`` both are reported overdue, once each."""
    told: list[Exception] = []
    pos = make_client(offline=POLICY, on_offline_error=told.append)
    fake.down = True
    from datetime import UTC, datetime

    future = datetime.fromtimestamp(clock.now + 90, UTC)
    ahead = pos.purchase(amount=1000, currency="BRL", card=CARD, captured_at=future)
    second = sell(pos, 1100)
    clock.now += POLICY.max_age_s + 1
    results = {r.key: r for r in pos.forward()}
    for key in (ahead.id, second.id):
        assert results[key].state is JournalState.STORED
        assert isinstance(results[key].error, StoredPaymentOverdueError), results[key].error
    assert sorted(e.key for e in told if isinstance(e, StoredPaymentOverdueError)) == sorted(
        [ahead.id, second.id]
    )
    pos.forward()  # reported once: the journal remembers
    assert len(told) == 2


# ---- 1c. the head-of-line scenario of the review, with the clock 90 s ahead ---------------


def test_a_sale_stamped_before_the_offset_was_known_is_restamped_and_forwarded(
    tmp_path: Path,
) -> None:
    """The review's s5: the device clock 90 s ahead; A sold offline before any offset was
    known. The link back: the next sale first forwards A — refused clock_skew → lookup 404
    → re-stamped (journaled) → accepted under the SAME key — then sells online. B, sold
    offline on the corrected clock, is forwarded as is."""
    world = World(device_ahead=90.0)
    pos = world_client(world, tmp_path / "pos.db")
    world.link = "down"
    a = sell(pos)
    assert a.offline and uuid.UUID(a.id).version == 4  # no server time known: no UUIDv7 claim
    world.link = "up"
    online = sell(pos, 1200)
    assert not online.offline
    assert [(x.status, x.code) for x in world.creates(a.id)] == [(422, "clock_skew"), (201, None)]
    world.link = "down"
    b = sell(pos, 1100)
    assert b.offline and uuid.UUID(b.id).version == 7
    world.link = "up"
    [result] = pos.forward()
    assert (result.key, result.state) == (b.id, JournalState.RESOLVED), result.error
    assert world.processed == {online.id: 1, a.id: 1, b.id: 1}
    assert [(x.status, x.code) for x in world.creates(b.id)] == [(201, None)]
    entry = pos.journal.get(a.id)
    assert entry is not None and entry.outcome is not None
    restamp = entry.outcome["restamped"]
    assert restamp["from"] == world.creates(a.id)[0].captured_at
    assert restamp["to"] == world.creates(a.id)[1].captured_at
    moved = parse_time(restamp["from"]) - parse_time(restamp["to"])
    assert 88 <= moved <= 92  # the sale's true time, not the forwarding time
    pos.close()


# ---- 2. dead RTC: far behind, booted offline ------------------------------------------------


@pytest.mark.parametrize("device_ahead", [-40 * DAY, 2 * DAY])
def test_a_terminal_booted_offline_with_its_clock_days_off_loses_no_sale(
    tmp_path: Path, device_ahead: float
) -> None:
    world = World(device_ahead=device_ahead, retention=35 * DAY)
    pos = world_client(world, tmp_path / "pos.db")
    world.link = "down"
    sales = [sell(pos), sell(pos, 1100)]
    world.link = "up"
    results = pos.forward()
    assert [r.state for r in results] == [JournalState.RESOLVED] * 2, [r.error for r in results]
    for sale in sales:
        assert world.processed[sale.id] == 1
        accepted = world.creates(sale.id)[-1]
        assert abs(parse_time(accepted.captured_at or "") - world.server_now) < 60
    pos.close()


def test_a_restamp_is_never_made_without_proof_from_another_process(tmp_path: Path) -> None:
    """Stored by another process (its monotonic time means nothing here): a refused advice
    is reported (the merchant reconciles), never re-stamped."""
    world = World(device_ahead=-40 * DAY, retention=35 * DAY)
    told: list[Exception] = []
    pos = world_client(world, tmp_path / "pos.db", on_offline_error=told.append)
    world.link = "down"
    sale = sell(pos)
    entry = pos.journal.get(sale.id)
    assert entry is not None and entry.outcome is not None
    with pos.journal._open():  # another boot stored it
        outcome = dict(entry.outcome)
        outcome["clock"] = {**outcome["clock"], "epoch": "an-earlier-boot"}
        pos.journal._db.execute(
            "UPDATE journal_entry SET outcome = ? WHERE key = ?",
            (json.dumps(outcome), sale.id),
        )
    world.link = "up"
    [result] = pos.forward()
    assert result.state is JournalState.REPORTED and isinstance(result.error, AdviceTooOldError)
    assert [e for e in told if isinstance(e, AdviceTooOldError)]
    assert world.processed == {} and len(world.creates(sale.id)) == 1
    pos.close()


# ---- 2b. the offset survives a reboot -----------------------------------------------------


def test_the_learned_offset_is_kept_so_a_reboot_offline_stamps_corrected_times(
    tmp_path: Path,
) -> None:
    world = World(device_ahead=90.0)
    first = world_client(world, tmp_path / "pos.db")
    assert not sell(first).offline  # teaches the offset (-90 s)
    first.close()
    world.link = "down"
    rebooted = world_client(world, tmp_path / "pos.db")
    sale = sell(rebooted, 1100)
    assert sale.offline and uuid.UUID(sale.id).version == 7
    [entry] = Journal(tmp_path / "pos.db").stored()
    assert abs(parse_time(entry.request["captured_at"]) - world.server_now) < 3
    world.link = "up"
    [result] = rebooted.forward()
    assert result.state is JournalState.RESOLVED
    assert [x.status for x in world.creates(sale.id)] == [201]  # no clock_skew at all
    rebooted.close()


def test_a_kept_offset_is_dropped_when_the_device_clock_went_backwards(tmp_path: Path) -> None:
    world = World(device_ahead=0.0)
    first = world_client(world, tmp_path / "pos.db")
    sell(first)
    first.close()
    world.device -= 40 * DAY  # the RTC battery died: the clock restarts far behind
    world.device_ahead = -40 * DAY
    world.link = "down"
    rebooted = world_client(world, tmp_path / "pos.db")
    assert rebooted.clock_offset_s is None  # that offset meant another clock
    rebooted.close()


# ---- 3. black-hole link ------------------------------------------------------------------


def test_a_black_hole_link_costs_one_full_connect_timeout_not_one_per_attempt(
    tmp_path: Path,
) -> None:
    world = World()
    policy = OfflinePolicy(
        floor_limit=5000, max_stored_count=5, max_stored_amount=20000, max_age_s=3600
    )
    pos = world_client(world, tmp_path / "pos.db", timeout=10.0, offline=policy)
    assert not sell(pos).offline
    world.link = "blackhole"
    durations = []
    for amount in (1000, 1100, 1200):
        started = world.device
        assert sell(pos, amount).offline
        durations.append(world.device - started)
    full = [w for w in world.connect_waits if w == 10.0]
    assert len(full) == 1  # the attempt that found the link down
    assert durations[0] <= 10.0 + 2.0 + 1  # then short connects
    # each later sale: its two connect attempts, short; no forward pass (the link is down)
    assert all(d <= 2 * 2.0 + 1 for d in durations[1:]), durations
    world.link = "up"
    assert not sell(pos, 1300).offline  # the link back: answered, the memory forgotten
    assert not pos.link_known_down()
    assert [r.state for r in pos.forward()] == [JournalState.RESOLVED] * 3
    pos.close()


def test_a_slow_connect_after_the_link_was_down_is_never_an_offline_sale_once_sent(
    tmp_path: Path,
) -> None:
    """With the link known down, only the connect is shortened: a request that connected
    and then lost its answer is in doubt (looked up), never sold offline."""
    world = World()
    pos = world_client(world, tmp_path / "pos.db", timeout=10.0)
    sell(pos)
    world.link = "blackhole"
    sell(pos, 1100)
    assert pos.link_known_down()
    world.link = "up"
    lost: list[str] = []
    inner = world.handle

    def lose_first_sale_answer(request: httpx.Request) -> httpx.Response:
        response = inner(request)
        is_create = request.method == "POST" and request.url.path == "/v1/transactions"
        if is_create and b'"offline"' not in request.content and not lost:
            lost.append(request.headers["idempotency-key"])
            raise httpx.ReadTimeout("answer lost", request=request)
        return response

    pos._http = httpx.Client(
        base_url="http://idempay.test", transport=httpx.MockTransport(lose_first_sale_answer)
    )
    result = sell(pos, 1200)
    assert lost == [result.id]  # processed, its answer lost: looked up, not sold offline
    assert not result.offline and world.processed[result.id] == 1
    pos.close()


def test_a_future_stamp_cannot_dodge_the_max_age_limit_on_new_offline_sales(
    fake: FakeIdempay, make_client: Any, clock: FakeClock
) -> None:
    """§4.12: until an overdue stored payment is forwarded, no new payment is accepted
    offline — measured on the SDK's stamp, not on a captured_at a clock ahead put in the
    future."""
    from datetime import UTC, datetime

    pos = make_client(offline=POLICY)
    fake.down = True
    future = datetime.fromtimestamp(clock.now + 90, UTC)
    pos.purchase(amount=1000, currency="BRL", card=CARD, captured_at=future)
    clock.now += POLICY.max_age_s + 1
    with pytest.raises(OfflineLimitError) as refused:
        sell(pos, 1100)
    assert refused.value.limit == "max_age_s"


def test_a_late_copy_of_the_old_advice_processed_first_is_the_result_of_the_restamp(
    tmp_path: Path,
) -> None:
    """The re-stamped body differs from the advice sent before. If a delayed copy of that
    earlier advice is processed first (the server's clock caught up with it), the re-stamped
    one is refused ``idempotency_key_reused`` and the lookup finds the transaction: one key,
    one transaction — never a second charge, never a new key."""
    world = World(device_ahead=90.0)
    inner = world.handle
    old_bodies: dict[str, bytes] = {}

    def late_copy_wins(request: httpx.Request) -> httpx.Response:
        advice = b'"entry_mode":"offline"' in request.content
        if advice and world.link == "up":
            key = request.headers["idempotency-key"]
            if key not in old_bodies:
                old_bodies[key] = request.content
            elif request.content != old_bodies[key] and key not in world.keys:
                # the first copy, held by the network, lands now with its old body
                body = json.loads(old_bodies[key])
                world.keys[key] = (
                    json.dumps(body, sort_keys=True),
                    _transaction(key, body),
                )
                world.processed[key] = 1
        return inner(request)

    pos = world_client(world, tmp_path / "pos.db", transport=httpx.MockTransport(late_copy_wins))
    world.link = "down"
    sold = sell(pos)
    world.link = "up"
    [result] = pos.forward()
    assert result.state is JournalState.RESOLVED, result.error
    assert result.transaction is not None and result.transaction.id == sold.id
    assert world.processed == {sold.id: 1}
    codes = [(a.status, a.code) for a in world.creates(sold.id)]
    assert codes == [(422, "clock_skew"), (422, "idempotency_key_reused")]
    pos.close()
