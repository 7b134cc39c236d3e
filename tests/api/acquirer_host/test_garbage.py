"""Garbage from a client closes that connection with a log line; the host and every other
connection go on being served."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from api.acquirer.framing import MAX_FRAME, frame
from api.acquirer.host.process import AcquirerProcess, sign_on
from api.acquirer.host.store import summary
from api.acquirer.messages import financial_request
from tests.api.acquirer_host.conftest import Wire, auth_request, new_stan, now
from tests.support.eventually import eventually


def _message(mti: str, fields: dict[str, str]) -> bytes:
    import iso8583

    from api.acquirer.spec import SPEC

    return bytes(iso8583.encode({"t": mti, **fields}, SPEC)[0])


def _bad_bitmap() -> bytes:
    """A 0800 whose primary bitmap names field 2, which the spec does not have."""
    good = _message("0800", {"7": "1128120000", "11": "000001", "70": "301"})
    bitmap = int(good[4:20], 16) | (1 << 62)  # bit 2 of 64
    return good[:4] + f"{bitmap:016X}".encode() + good[20:]


GARBAGE = {
    "zero length": b"\x00\x00",
    "oversized frame": (MAX_FRAME + 1).to_bytes(2, "big") + b"0" * 64,
    "undecodable": frame(b"hello, acquirer"),
    "bad bitmap": frame(_bad_bitmap()),
    "unknown MTI": frame(_message("0100", {"11": "000001", "37": "ABCDEF123456"})),
    "an answer sent as a request": frame(_message("0810", {"11": "000001", "39": "00"})),
    "0200 missing fields": frame(_message("0200", {"11": "000001", "37": "ABCDEF123456"})),
    "bad private data": frame(
        _message(
            "0200",
            {
                "3": "000000",
                "4": "000000001250",
                "7": "1128120000",
                "11": "000001",
                "37": "ABCDEF123456",
                "48": "no tags here",
                "49": "986",
            },
        )
    ),
    "bad percent-encoding in private data": frame(
        _message(
            "0200",
            {
                "3": "000000",
                "4": "000000001250",
                "7": "1128120000",
                "11": "000001",
                "37": "ABCDEF123456",
                "48": "M=%FF;T=T-1;K=tok_visa",
                "49": "986",
            },
        )
    ),
    "truncated frame": (200).to_bytes(2, "big") + b"0200",
}


@pytest.fixture(scope="module")
def shared_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AcquirerProcess]:
    proc = AcquirerProcess(store=tmp_path_factory.mktemp("garbage") / "a.sqlite3").start()
    yield proc
    proc.stop()


def _garbage_lines(host: AcquirerProcess) -> int:
    return host.log_tail(1_000_000).count('"acquirer.garbage"')


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_garbage_closes_only_its_connection(shared_host: AcquirerProcess, kind: str) -> None:
    bystander = Wire(shared_host.port)
    bystander.call(auth_request())  # connected and served before the garbage
    logged = _garbage_lines(shared_host)
    hostile = Wire(shared_host.port)
    hostile.raw(GARBAGE[kind])
    if kind == "truncated frame":
        hostile.sock.shutdown(socket.SHUT_WR)  # the stream ends inside the frame
    assert hostile.closed_by_host()
    assert shared_host.alive()
    assert bystander.call(auth_request()).response_code == "00"
    assert sign_on(shared_host.port)
    eventually(
        lambda: _garbage_lines(shared_host), what="a garbage log line", until=lambda n: n > logged
    )
    bystander.close()
    hostile.close()


def test_a_0200_read_before_garbage_is_still_decided(shared_host: AcquirerProcess) -> None:
    wire = Wire(shared_host.port)
    req = auth_request()
    wire.raw(frame(financial_request(req, stan=new_stan(), transmitted_at=now())) + b"\x00\x00")
    row = eventually(
        lambda: summary(shared_host.store).get(req.rrn), what="the 0200 read before the garbage"
    )
    assert row is not None and (row.requests, row.approved) == (1, True)
    wire.close()
