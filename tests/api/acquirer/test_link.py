"""The link against a fake acquirer on real loopback sockets: answers, late answers,
broken connections, garbage, many requests in flight, reconnects, STAN wrap."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from api.acquirer._stan import StanAllocator, backoff_delay
from api.acquirer.link import AcquirerLink, parse_acquirer_url
from api.acquirer.messages import ECHO, Request, answer, network_request
from api.acquirer.types import AuthorizationRequest, InDoubt, NeverSent, ReversalRequest
from tests.api.acquirer.fake_acquirer import FakeAcquirer, Peer
from tests.support.eventually import eventually_async

TIMEOUT_S = 5.0  # generous: the tests that need a timeout pass a short one explicitly


def purchase(rrn: str = "RRN000000001", token: str = "tok_visa") -> AuthorizationRequest:
    return AuthorizationRequest(
        rrn=rrn, merchant_id="merchant-1", terminal_id="T-0001", card_token=token,
        amount=1250, currency="BRL", type="purchase",
        captured_at=datetime(2026, 11, 20, 12, 0, tzinfo=UTC),
    )  # fmt: skip


def reversal(*, repeat: bool = False) -> ReversalRequest:
    return ReversalRequest(
        rrn="RRN000000001", merchant_id="merchant-1", terminal_id="T-0001", amount=1250,
        currency="BRL", type="purchase", original_stan="000007",
        original_transmitted_at=datetime(2026, 11, 20, 12, 0, 1, tzinfo=UTC), repeat=repeat,
    )  # fmt: skip


@asynccontextmanager
async def running(link: AcquirerLink) -> AsyncIterator[AcquirerLink]:
    await link.start()
    try:
        yield link
    finally:
        await link.close()


@asynccontextmanager
async def acquirer(fake: FakeAcquirer) -> AsyncIterator[FakeAcquirer]:
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


def link_to(fake: FakeAcquirer, **kwargs: object) -> AcquirerLink:
    options: dict[str, object] = {"connections": 1, "backoff_base_s": 0.01}
    return AcquirerLink(fake.url, **(options | kwargs))  # type: ignore[arg-type]


async def test_approval_and_decline_come_back_from_the_0210() -> None:
    async def decide(request: Request, peer: Peer) -> None:
        auth = request.authorization
        assert auth is not None
        declined = auth.card_token == "tok_decline_insufficient_funds"
        code, approval = ("51", None) if declined else ("00", "A1B2C3")
        peer.send(answer(request, response_code=code, authorization_code=approval))

    async with acquirer(FakeAcquirer(decide)) as fake, running(link_to(fake)) as link:
        approved = await link.authorize(purchase(), timeout_s=TIMEOUT_S)
        declined = await link.authorize(
            purchase("RRN000000002", "tok_decline_insufficient_funds"), timeout_s=TIMEOUT_S
        )
    assert (approved.approved, approved.authorization_code, approved.response_code) == (
        True, "A1B2C3", "00",
    )  # fmt: skip
    assert (declined.approved, declined.decline_reason) == (False, "insufficient_funds")
    assert fake.financial()[0].authorization == purchase()
    assert approved.stan == fake.financial()[0].stan
    assert [r.network_code for r in fake.received if r.mti == "0800"] == ["001"]  # sign-on


async def test_reverse_and_advise_are_acknowledged() -> None:
    async with acquirer(FakeAcquirer()) as fake, running(link_to(fake)) as link:
        assert await link.reverse(reversal(), timeout_s=TIMEOUT_S) is True
        assert await link.advise(reversal(), timeout_s=TIMEOUT_S) is True
        assert await link.advise(reversal(repeat=True), timeout_s=TIMEOUT_S) is True
    sent = [r for r in fake.received if r.mti != "0800"]
    assert [r.mti for r in sent] == ["0400", "0420", "0421"]
    assert all(r.reversal is not None and r.reversal.original_stan == "000007" for r in sent)


async def test_unanswered_0200_is_in_doubt_and_its_late_answer_is_counted_not_taken() -> None:
    release = asyncio.Event()

    async def answer_late(request: Request, peer: Peer) -> None:
        if request.authorization is not None and request.authorization.card_token == "tok_late":
            await release.wait()
        await _approve(request, peer)

    async with acquirer(FakeAcquirer(answer_late)) as fake, running(link_to(fake)) as link:
        with pytest.raises(InDoubt):
            await link.authorize(purchase(token="tok_late"), timeout_s=0.2)
        release.set()
        await eventually_async(lambda: link.late_answers, what="the late 0210 counted")
        after = await link.authorize(purchase("RRN000000002"), timeout_s=TIMEOUT_S)
        assert after.approved
        assert (link.garbage_frames, link.reconnects, link.in_flight) == (0, 0, 0)
    assert len([r for r in fake.financial() if r.authorization.rrn == "RRN000000001"]) == 1  # type: ignore[union-attr]


async def test_connection_cut_after_the_write_is_in_doubt_and_never_resent() -> None:
    async def cut(request: Request, peer: Peer) -> None:
        if request.authorization is not None and request.authorization.card_token == "tok_cut":
            peer.cut()
            return
        await _approve(request, peer)

    async with acquirer(FakeAcquirer(cut)) as fake, running(link_to(fake)) as link:
        with pytest.raises(InDoubt):
            await link.authorize(purchase(token="tok_cut"), timeout_s=TIMEOUT_S)
        await eventually_async(lambda: link.state == "up" and link.reconnects == 1, what="back up")
        assert (await link.authorize(purchase("RRN000000002"), timeout_s=TIMEOUT_S)).approved
    assert [r.authorization.rrn for r in fake.financial()] == ["RRN000000001", "RRN000000002"]  # type: ignore[union-attr]
    assert link.garbage_frames == 0


async def test_no_acquirer_listening_is_never_sent() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    link = AcquirerLink(f"iso8583://127.0.0.1:{port}", connections=2, acquire_wait_s=0.2)
    async with running(link):
        assert link.state in ("down", "connecting")
        with pytest.raises(NeverSent):
            await link.authorize(purchase(), timeout_s=TIMEOUT_S)
        assert link.in_flight == 0


def _unknown_stan(request: Request, peer: Peer) -> None:
    peer.send(answer(_with(request, "11", "424242"), response_code="00"))


def _wrong_mti(request: Request, peer: Peer) -> None:
    peer.send(answer(_with(request, "t", "0400"), response_code="00"))


GARBAGE: dict[str, Callable[[Request, Peer], None]] = {
    "undecodable": lambda request, peer: peer.send(b"this is not ISO 8583"),
    "oversized": lambda request, peer: peer.send_raw(b"\xff\xff" + b"0" * 64),
    "zero length": lambda request, peer: peer.send_raw(b"\x00\x00"),
    "unknown STAN": _unknown_stan,
    "wrong MTI": _wrong_mti,
    "a request, not an answer": lambda request, peer: peer.send(_echo_request()),
}


@pytest.mark.parametrize("kind", list(GARBAGE))
async def test_garbage_resets_the_connection_and_is_never_an_answer(kind: str) -> None:
    async def garbage(request: Request, peer: Peer) -> None:
        if request.authorization is not None and request.authorization.card_token == "tok_bad":
            GARBAGE[kind](request, peer)
            return
        await _approve(request, peer)

    async with acquirer(FakeAcquirer(garbage)) as fake, running(link_to(fake)) as link:
        with pytest.raises(InDoubt):
            await link.authorize(purchase(token="tok_bad"), timeout_s=TIMEOUT_S)
        assert link.garbage_frames == 1
        await eventually_async(lambda: link.state == "up" and link.reconnects == 1, what="back up")
        assert (await link.authorize(purchase("RRN000000002"), timeout_s=TIMEOUT_S)).approved


async def test_many_requests_on_one_connection_matched_out_of_order() -> None:
    count = 50
    arrived: list[tuple[Request, Peer]] = []
    all_in = asyncio.Event()

    async def reverse_order(request: Request, peer: Peer) -> None:
        arrived.append((request, peer))
        if len(arrived) == count:
            all_in.set()
        await all_in.wait()
        if (request, peer) == arrived[0]:
            for req, p in reversed(arrived):
                auth = req.authorization
                assert auth is not None
                p.send(answer(req, response_code="00", authorization_code=auth.rrn[-6:]))

    rrns = [f"RRN{i:09d}" for i in range(count)]
    async with acquirer(FakeAcquirer(reverse_order)) as fake, running(link_to(fake)) as link:
        results = await asyncio.gather(
            *(link.authorize(purchase(rrn), timeout_s=TIMEOUT_S) for rrn in rrns)
        )
    assert [r.authorization_code for r in results] == [rrn[-6:] for rrn in rrns]
    assert len({r.stan for r in results}) == count
    assert (link.garbage_frames, link.late_answers) == (0, 0)


async def test_reconnects_after_the_acquirer_restarts() -> None:
    fake = await FakeAcquirer().start()
    link = link_to(fake, connections=2)
    async with running(link):
        assert (await link.authorize(purchase(), timeout_s=TIMEOUT_S)).approved
        await fake.stop()
        await eventually_async(lambda: link.state != "up", what="the link sees it down")
        with pytest.raises(NeverSent):
            await link.authorize(purchase("RRN000000002"), timeout_s=0.1)
        async with acquirer(FakeAcquirer(port=fake.port)) as again:
            await eventually_async(lambda: link.state == "up", what="the link back up")
            assert (await link.authorize(purchase("RRN000000003"), timeout_s=TIMEOUT_S)).approved
    assert link.reconnects == 2
    assert [r.network_code for r in again.received if r.mti == "0800"][0] == "001"


async def test_stan_wraps_from_999999_to_000001() -> None:
    async with acquirer(FakeAcquirer()) as fake, running(link_to(fake, first_stan=999_998)) as link:
        for i in range(3):
            await link.authorize(purchase(f"RRN00000000{i}"), timeout_s=TIMEOUT_S)
    assert [r.stan for r in fake.received] == ["999998", "999999", "000001", "000002"]


async def test_echo_when_idle() -> None:
    async with acquirer(FakeAcquirer()) as fake, running(link_to(fake, echo_interval_s=0.05)):
        await eventually_async(
            lambda: [r.network_code for r in fake.received].count("301") >= 2, what="echoes"
        )


async def test_guard_runs_before_every_write_and_can_stop_it() -> None:
    calls: list[str] = []

    def guard() -> None:
        calls.append("checked")
        if len(calls) > 1:
            raise RuntimeError("a database transaction is open")

    async with (
        acquirer(FakeAcquirer()) as fake,
        running(link_to(fake, assert_no_transaction=guard)) as link,
    ):
        assert (await link.authorize(purchase(), timeout_s=TIMEOUT_S)).approved
        with pytest.raises(RuntimeError):
            await link.authorize(purchase("RRN000000002"), timeout_s=TIMEOUT_S)
    assert len(fake.financial()) == 1


async def test_close_during_sign_on_leaves_no_reader_behind() -> None:
    async with acquirer(FakeAcquirer(network=None)) as fake:
        link = link_to(fake, network_timeout_s=30.0)
        starting = asyncio.create_task(link.start())
        await eventually_async(lambda: fake.received, what="the sign-on sent")
        assert link.state == "connecting"
        await link.close()
        await starting
    readers = [t for t in asyncio.all_tasks() if t.get_name().startswith("acquirer-reader")]
    assert readers == []
    assert link.state == "down"


async def test_a_refused_sign_on_is_not_a_connection() -> None:
    async def refuse(request: Request, peer: Peer) -> None:
        peer.send(answer(request, response_code="91"))

    fake = FakeAcquirer(network=refuse)
    async with acquirer(fake), running(link_to(fake, acquire_wait_s=0.1)) as link:
        assert link.state != "up"
        with pytest.raises(NeverSent):
            await link.authorize(purchase(), timeout_s=TIMEOUT_S)
    assert fake.financial() == []


async def test_an_unanswered_echo_resets_the_connection() -> None:
    async def sign_on_only(request: Request, peer: Peer) -> None:
        if request.network_code == "001":
            await _approve(request, peer)

    fake = FakeAcquirer(network=sign_on_only)
    options = {"echo_interval_s": 0.05, "network_timeout_s": 0.1}
    async with acquirer(fake), running(link_to(fake, **options)) as link:
        await eventually_async(lambda: link.reconnects >= 1, what="a reconnect")
        assert (await link.authorize(purchase(), timeout_s=TIMEOUT_S)).approved
    assert link.garbage_frames == 0


def test_package_exports_the_public_names() -> None:
    import api.acquirer as package

    assert sorted(package.__all__) == package.__all__
    assert all(getattr(package, name) is not None for name in package.__all__)


def test_stan_allocator_wraps_and_skips_stans_in_flight() -> None:
    stans = StanAllocator(999_998)
    in_flight = {"999999", "000002"}
    assert [stans.allocate(in_flight) for _ in range(3)] == ["999998", "000001", "000003"]


def test_stan_allocator_refuses_when_every_stan_is_in_flight() -> None:
    class Everything:
        def __contains__(self, item: object) -> bool:
            return True

    with pytest.raises(RuntimeError):
        StanAllocator().allocate(Everything())


def test_backoff_is_full_jitter_doubling_to_a_cap() -> None:
    top = [backoff_delay(n, base_s=0.1, cap_s=1.0, rand=lambda: 1.0) for n in range(6)]
    assert top == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert backoff_delay(3, rand=lambda: 0.0) == 0.0
    assert backoff_delay(10_000, cap_s=7.0, rand=lambda: 0.5) == 3.5


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8583", "iso8583://127.0.0.1", "iso8583://:8583", "127.0.0.1:1"]
)
def test_only_iso8583_urls_with_host_and_port(url: str) -> None:
    with pytest.raises(ValueError, match="iso8583://host:port"):
        parse_acquirer_url(url)


def test_url_gives_host_and_port() -> None:
    assert parse_acquirer_url("iso8583://acquirer-sim:8583") == ("acquirer-sim", 8583)


async def _approve(request: Request, peer: Peer) -> None:
    peer.send(answer(request, response_code="00", authorization_code="A00001"))


def _with(request: Request, field: str, value: str) -> Request:
    """``request`` with one field (or, for "t", its MTI) changed."""
    if field == "t":
        return replace(request, mti=value)
    return replace(request, fields=request.fields | {field: value})


def _echo_request() -> bytes:
    return network_request(ECHO, stan="000123", transmitted_at=datetime.now(UTC))


async def test_a_slot_whose_supervisor_fails_starts_anyway_and_tries_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unexpected error in a connection slot (here the log stream failing at sign-on —
    what a closed stdout did) neither leaves ``start`` waiting forever nor the slot empty."""
    import api.acquirer.link as link_module

    real_info = link_module.log.info
    failed: list[str] = []

    def info(event: str, **fields: object) -> None:
        if event == "acquirer.signed_on" and not failed:
            failed.append(event)
            raise ValueError("I/O operation on closed file.")
        real_info(event, **fields)

    monkeypatch.setattr(link_module.log, "info", info)
    async with acquirer(FakeAcquirer()) as fake:
        link = link_to(fake)
        await asyncio.wait_for(link.start(), 10)
        try:
            await eventually_async(lambda: link.state == "up", what="the slot up again")
            assert (await link.authorize(purchase(), timeout_s=TIMEOUT_S)).approved
        finally:
            await link.close()
    assert failed == ["acquirer.signed_on"]
