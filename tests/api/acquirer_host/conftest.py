"""The acquirer host as a real child process, and a blocking ISO 8583 client for it.

``Wire`` speaks the link's frames on one socket: ``send`` a request, ``answer()`` the next
answer. "Never answered" is shown without timing: requests on one connection are queued
to the host's store in arrival order and each is answered right after its commit, so when
an 0800 echo sent AFTER a request comes back first, the request was decided and left
unanswered (``answers_until_echo`` collects what came before the echo).
"""

from __future__ import annotations

import itertools
import random
import socket
import string
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from api.acquirer.framing import frame
from api.acquirer.host.process import AcquirerProcess
from api.acquirer.messages import (
    ECHO,
    Answer,
    financial_request,
    network_request,
    parse_answer,
    reversal_advice,
    reversal_request,
)
from api.acquirer.types import AuthorizationRequest, ReversalRequest

_stans = itertools.count(1)


def new_stan() -> str:
    return f"{next(_stans) % 1_000_000:06d}"


def new_rrn() -> str:
    return "".join(random.choices(string.ascii_uppercase + string.digits, k=12))


def now() -> datetime:
    return datetime.now(UTC)


def auth_request(
    token: str = "tok_visa_4242",
    *,
    rrn: str | None = None,
    amount: int = 1250,
    kind: str = "purchase",
    merchant: str = "merchant-a",
    terminal: str = "T-0001",
) -> AuthorizationRequest:
    return AuthorizationRequest(
        rrn=rrn or new_rrn(),
        merchant_id=merchant,
        terminal_id=terminal,
        card_token=token,
        amount=amount,
        currency="BRL",
        type=kind,
        captured_at=now(),
    )


def reversal_of(req: AuthorizationRequest, *, repeat: bool = False) -> ReversalRequest:
    return ReversalRequest(
        rrn=req.rrn,
        merchant_id=req.merchant_id,
        terminal_id=req.terminal_id,
        amount=req.amount,
        currency=req.currency,
        type=req.type,
        original_stan="000000",
        original_transmitted_at=None,
        repeat=repeat,
    )


class Wire:
    """One TCP connection to the host."""

    def __init__(self, port: int, *, timeout: float = 15.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)

    def close(self) -> None:
        self.sock.close()

    def raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, payload: bytes) -> None:
        self.sock.sendall(frame(payload))

    def authorize(self, req: AuthorizationRequest, *, stan: str | None = None) -> str:
        stan = stan or new_stan()
        self.send(financial_request(req, stan=stan, transmitted_at=now()))
        return stan

    def reverse(self, rev: ReversalRequest, *, advice: bool = False) -> str:
        stan = new_stan()
        build = reversal_advice if advice else reversal_request
        self.send(build(rev, stan=stan, transmitted_at=now()))
        return stan

    def echo(self) -> str:
        stan = new_stan()
        self.send(network_request(ECHO, stan=stan, transmitted_at=now()))
        return stan

    def _exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("closed by the host")
            data += chunk
        return data

    def answer(self) -> Answer:
        size = int.from_bytes(self._exactly(2), "big")
        return parse_answer(self._exactly(size))

    def call(self, req: AuthorizationRequest) -> Answer:
        stan = self.authorize(req)
        got = self.answer()
        assert (got.mti, got.stan, got.rrn) == ("0210", stan, req.rrn)
        return got

    def answers_until_echo(self) -> list[Answer]:
        """Send an echo; return every answer that arrived before the echo's 0810."""
        stan = self.echo()
        before: list[Answer] = []
        while True:
            got = self.answer()
            if got.mti == "0810" and got.stan == stan:
                return before
            before.append(got)

    def closed_by_host(self) -> bool:
        """True when the host closed this connection (EOF or reset)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


def start_host(tmp_path: Path, *args: str) -> AcquirerProcess:
    return AcquirerProcess(store=tmp_path / "acquirer.sqlite3", args=args).start()


@pytest.fixture
def host(tmp_path: Path) -> Iterator[AcquirerProcess]:
    """A host of this test's own (tok_issuer_slow at 1 s, seeded)."""
    proc = start_host(tmp_path, "--seed", "7", "--slow-seconds", "1.0")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def wire(host: AcquirerProcess) -> Iterator[Wire]:
    w = Wire(host.port)
    try:
        yield w
    finally:
        w.close()
