"""A hostile acquirer (contract §2.9): answers to an unknown STAN or RRN, the wrong MTI for
a STAN, bytes that are no message, an answer on a connection the request did not go on, a
duplicate 0210. The server takes none of them as an answer — each key ends declined /
acquirer_timeout with its advice (or approved by the real answer, never by a forged one)
— and the link resets the connection it came on and signs on again."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace

import pytest

from api.acquirer.messages import Request, answer
from tests.api.acquirer.fake_acquirer import FakeAcquirer, Peer, approve
from tests.api.acquirer_boundary.conftest import Rig
from tests.api.acquirer_boundary.fake import ThreadedFake
from tests.support.client import Api, body, card, new_key
from tests.support.eventually import eventually
from tests.support.services import Server

TIMEOUT = "acquirer_timeout"
_fakes: list[FakeAcquirer] = []  # the running fake, for the policy to find its connections


def _forged(request: Request, mti: str = "0200", **fields: str) -> bytes:
    return answer(
        replace(request, mti=mti, fields={**request.fields, **fields}),
        response_code="00",
        authorization_code="FORGED",
    )


async def hostile(request: Request, peer: Peer) -> None:
    """By card token: what the acquirer answers to a 0200 (anything else is answered
    properly, advices included)."""
    token = request.authorization.card_token if request.authorization else ""
    if token == "tok_forge_unknown_stan":
        other = f"{(int(request.stan) + 500_000) % 1_000_000:06d}"
        peer.send(_forged(request, **{"11": other}))
    elif token == "tok_forge_unknown_rrn":
        peer.send(_forged(request, **{"37": "ZZZZZZZZZZZZ"}))
    elif token == "tok_forge_wrong_mti":  # a 0410 for the 0200's STAN and RRN
        peer.send(_forged(request, mti="0400"))
    elif token == "tok_forge_undecodable":
        peer.send(b"\x00\x00 this is not ISO 8583 \xff\xfe")
    elif token == "tok_forge_bad_length":
        peer.send_raw(b"\xff\xff" + b"\x00" * 64)
    elif token == "tok_forge_other_connection":  # the real answer, on another connection
        peers = _fakes[0]._peers
        others = [p for p in peers if p is not peer and not p.writer.is_closing()]
        if others:
            others[0].send(_forged(request))
    elif token == "tok_forge_duplicate":
        await approve(request, peer)
        await asyncio.sleep(0.05)
        await approve(request, peer)
    else:
        await approve(request, peer)


FORGERIES = [
    "tok_forge_unknown_stan",
    "tok_forge_unknown_rrn",
    "tok_forge_wrong_mti",
    "tok_forge_undecodable",
    "tok_forge_bad_length",
    "tok_forge_other_connection",
]


@pytest.fixture
def fake() -> Iterator[ThreadedFake]:
    threaded = ThreadedFake(hostile)
    _fakes[:] = [threaded.fake]
    threaded.start()
    try:
        yield threaded
    finally:
        threaded.stop()
        _fakes.clear()


def _signed_on(rig: Rig, fake: ThreadedFake) -> tuple[Server, Api]:
    """A server on the fake acquirer, once both its connections signed on, and its API."""
    server = rig.server(acquirer_url=fake.url)
    api = rig.api(server)
    eventually(fake.sign_ons, what="both connections signed on", until=lambda n: n >= 2)
    return server, api


def test_forged_answers_are_never_taken_and_the_link_reconnects(
    rig: Rig, fake: ThreadedFake
) -> None:
    server, api = _signed_on(rig, fake)
    for token in FORGERIES:
        before = fake.sign_ons()
        key = new_key()
        first = api.create(key, body(card=card(token)))
        assert first.status_code in (201, 202), first.text
        txn = rig.settled(api, key)
        assert txn["status"] == "declined", (token, txn)
        assert txn["decline_reason"] == TIMEOUT, (token, txn)
        assert txn["authorization_code"] is None
        assert fake.received("0200", rig.rrn(key)) == 1, token
        advice = rig.acknowledged(key)  # the fake acknowledges every advice
        assert advice["kind"] == "timeout"
        eventually(
            fake.sign_ons,
            what=f"a new sign-on after {token}",
            until=lambda n, before=before: n > before,  # type: ignore[misc]
        )
        # the link is usable again: a plain create is approved by its real answer
        plain = api.create(new_key())
        assert plain.status_code == 201 and plain.json()["status"] == "approved", token
    garbage = rig.server_log(server).count("acquirer.garbage")
    assert garbage >= len(FORGERIES)


def test_duplicate_0210_keeps_the_real_approval_and_resets_the_connection(
    rig: Rig, fake: ThreadedFake
) -> None:
    server, api = _signed_on(rig, fake)
    before = fake.sign_ons()
    key = new_key()
    response = api.create(key, body(card=card("tok_forge_duplicate")))
    assert response.status_code == 201, response.text
    txn = response.json()
    assert txn["status"] == "approved"  # the first 0210: the real answer
    eventually(fake.sign_ons, what="a new sign-on after the duplicate", until=lambda n: n > before)
    assert api.lookup(key).json() == txn
    assert rig.advice(key) is None  # approved by the acquirer: nothing to undo
    assert fake.received("0200", rig.rrn(key)) == 1
    assert "acquirer.garbage" in rig.server_log(server)
