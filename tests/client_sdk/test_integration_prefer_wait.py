"""The SDK's in-doubt lookups ask ``Prefer: wait`` (issue 17, contract §2.8): a payment whose
create answer is lost while the issuer is still working is settled by ONE lookup that the
server holds until the key commits — not 202 + Retry-After + another lookup. Real server
on both backends; the lost answer is a transport that gives up before the reply comes."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from integration_db import Merchant

from api.acquirer.host import store
from client_sdk import Client, RetryPolicy
from tests.support.backend import Backend
from tests.support.eventually import eventually
from tests.support.services import Server

ISSUER_SLOW_S = 3.0  # inside the acquirer timeout below: the create itself settles the key
SLOW_CARD = {"token": "tok_issuer_slow", "last4": "0002", "brand": "visa"}


class LosesTheFirstCreateAnswer(httpx.BaseTransport):
    """Forwards everything; the first create is sent, and once the server has claimed its key
    its answer is given up on (a read timeout: in doubt) while the issuer still works on it.
    Records what the terminal sent and got."""

    def __init__(self, claimed: Callable[[str], bool]) -> None:
        self.claimed = claimed
        self.inner = httpx.HTTPTransport()
        self.seen: list[tuple[str, str, str | None, int | None]] = []
        self._lost = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        prefer = request.headers.get("prefer")
        if request.method == "POST" and request.url.path == "/v1/transactions" and not self._lost:
            self._lost = True
            request.read()
            threading.Thread(target=self.inner.handle_request, args=(request,), daemon=True).start()
            key = request.headers["idempotency-key"]
            eventually(lambda: self.claimed(key), what="the create claimed", timeout=30)
            self.seen.append((request.method, request.url.path, prefer, None))
            raise httpx.ReadTimeout("answer lost", request=request)
        response = self.inner.handle_request(request)
        response.read()
        self.seen.append((request.method, request.url.path, prefer, response.status_code))
        return response

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def slow_server(private_backend: Backend) -> Iterator[Server]:
    server = private_backend.server(
        IDEMPAY_ACQUIRER_SLOW_SECONDS=str(ISSUER_SLOW_S),
        IDEMPAY_ANSWER_WITHIN="8",
        IDEMPAY_ACQUIRER_TIMEOUT="10",  # the 0210 comes in time: never in doubt
    )
    yield server
    server.stop()


def test_a_lost_answer_is_settled_by_one_waiting_lookup(
    private_backend: Backend, slow_server: Server, tmp_path: Path
) -> None:
    merchant = Merchant.create(private_backend, f"wait-{uuid.uuid4().hex[:8]}")
    transport = LosesTheFirstCreateAnswer(
        lambda key: merchant.key_states().get(key) == "processing"
    )
    with Client(
        slow_server.url,
        merchant.api_key,
        terminal_id="T-WAIT",
        journal=tmp_path / "pos.db",
        timeout=10.0,
        retry=RetryPolicy(base=0.02, cap=0.2),
        transport=transport,
    ) as pos:
        result = pos.purchase(amount=4200, currency="BRL", card=SLOW_CARD, deadline_s=60)
    assert result.status == "approved"
    payment = [(m, p, w, s) for m, p, w, s in transport.seen if "/v1/transactions" in p]
    lookups = [entry for entry in payment if entry[0] == "GET"]
    assert payment[0][:2] == ("POST", "/v1/transactions")  # the lost create
    assert lookups == [("GET", f"/v1/transactions/{result.id}", "wait=8", 200)], payment
    assert len(payment) == 2  # one create, one lookup: no 202, no second lookup, no resend
    assert merchant.charges() == {result.id: 1}
    [(rrn,)] = private_backend.sql(
        'SELECT rrn FROM "transaction" WHERE merchant_id = :m AND id = :k',
        m=merchant.id,
        k=result.id,
    )
    at_acquirer = store.summary(private_backend.tmp / "var" / "acquirer.sqlite3")[rrn]
    assert (at_acquirer.requests, at_acquirer.approved, at_acquirer.reversed) == (1, True, False)


def test_the_lookup_wait_stays_inside_the_request_timeout() -> None:
    from client_sdk._protocol import lookup_wait

    assert lookup_wait(10.0) == {"Prefer": "wait=8"}
    assert lookup_wait(30.0) == {"Prefer": "wait=8"}
    assert lookup_wait(5.5) == {"Prefer": "wait=3"}
    assert lookup_wait(2.9) == {}  # under a second left to wait: no preference
