"""The hostile cases of issues 24 and 14 against the real server on Postgres, through the
chaos proxy where the network must hold a copy:

- issue 24 item 1: a second driver (``recover()`` in another process) on the journal
  while a payment is in flight — it used to sell the key itself and make the first
  driver report failure for an approved payment;
- issue 24 item 3: a proxy's mangled gzip 201 (``httpx.DecodingError``) after the server
  approved — it used to escape raw;
- issue 14 item 1: the original create is held in the network, the resend is refused by
  a proxy (413) — it used to end the payment as rejected, and the original was charged.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from integration_db import Merchant, journal_entries, wait_for

from client_sdk import Client, JournalState, RetryPolicy
from idempay_tools.chaos_proxy import ProxyThread
from tests.support.backend import Backend
from tests.support.services import Server

CARD = {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}
TERMINAL = Path(__file__).with_name("integration_terminal.py")
CREATE = "POST /v1/transactions "


class Rewriting(httpx.BaseTransport):
    """A misbehaving middlebox in front of the real server: ``rewrite`` may replace the
    answer to a request (or the request's delivery) by what the test says."""

    def __init__(self, rewrite: dict[str, object]) -> None:
        self.inner = httpx.HTTPTransport()
        self.rewrite = rewrite
        self.creates = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        is_create = request.method == "POST" and request.url.path == "/v1/transactions"
        self.creates += is_create
        if is_create and self.creates == self.rewrite.get("refuse_create"):
            problem = b'{"title": "Request Entity Too Large", "status": 413}'
            return httpx.Response(413, content=problem, request=request)
        response = self.inner.handle_request(request)
        if is_create and self.creates == self.rewrite.get("mangle_create"):
            response.read()
            return httpx.Response(
                response.status_code,
                headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
                content=b"\x1f\x8b not gzip at all",
                request=request,
            )
        return response

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("kind", ["purchase", "refund"])
def test_a_mangled_gzip_201_leaves_the_payment_in_doubt_and_it_is_resolved(
    pg_backend: Backend, pg_server: Server, tmp_path: Path, kind: str
) -> None:
    merchant = Merchant.create(pg_backend, f"gzip-{uuid.uuid4().hex[:8]}")
    with merchant.client(
        pg_server.url, "T-GZIP", tmp_path / "pos.db", transport=Rewriting({"mangle_create": 1})
    ) as pos:
        pay = pos.purchase if kind == "purchase" else pos.refund
        result = pay(amount=4321, currency="BRL", card=CARD)
    assert (result.status, result.type) == ("approved", kind)
    assert merchant.transactions() == {result.id: "approved"}
    # Request events reach the database through the server's batched writer: wait for it.
    events = wait_for(lambda: merchant.create_events(result.id), timeout=10, what="the event")
    assert events == [("created", 201, 1)]


def test_a_later_attempt_refused_by_a_proxy_waits_for_the_original_in_flight(
    pg_backend: Backend, proxy: ProxyThread, tmp_path: Path
) -> None:
    merchant = Merchant.create(pg_backend, f"later-{uuid.uuid4().hex[:8]}")
    proxy.hold_next(seconds=2.5, match=CREATE)  # the original is slow on the way
    with Client(
        f"http://127.0.0.1:{proxy.port}",
        merchant.api_key,
        terminal_id="T-LATER",
        journal=tmp_path / "pos.db",
        transport=Rewriting({"refuse_create": 2}),  # the resend: 413 from a proxy
        timeout=1.0,
        retry=RetryPolicy(base=0.05, cap=0.3),
    ) as pos:
        result = pos.purchase(amount=5555, currency="BRL", card=CARD, deadline_s=20)
    assert result.status == "approved"
    assert merchant.transactions() == {result.id: "approved"}
    assert merchant.charges() == {result.id: 1}
    [entry] = journal_entries(tmp_path / "pos.db")
    assert entry.state is JournalState.RESOLVED and entry.outcome is not None
    assert entry.outcome["status"] == "approved"


def test_recover_in_another_process_leaves_a_payment_in_flight_to_its_driver(
    pg_backend: Backend, proxy: ProxyThread, tmp_path: Path
) -> None:
    merchant = Merchant.create(pg_backend, f"lease-{uuid.uuid4().hex[:8]}")
    journal = tmp_path / "pos.db"
    proxy.hold_next(seconds=3.0, match=CREATE)
    with Client(
        f"http://127.0.0.1:{proxy.port}",
        merchant.api_key,
        terminal_id="T-LEASE",
        journal=journal,
        timeout=10.0,
    ) as pos:
        recovering: list[subprocess.CompletedProcess[str]] = []

        def recover_elsewhere(request: httpx.Request) -> None:
            if request.method == "POST" and not recovering:  # A's create is journaled
                recovering.append(
                    subprocess.run(
                        [
                            sys.executable,
                            str(TERMINAL),
                            "recover",
                            str(proxy_url(proxy)),
                            merchant.api_key,
                            str(journal),
                        ],  # fmt: skip
                        capture_output=True,
                        text=True,
                        timeout=60,
                    )
                )

        pos._http.event_hooks["request"].append(recover_elsewhere)
        result = pos.purchase(amount=7777, currency="BRL", card=CARD, deadline_s=30)
    [other] = recovering
    assert other.returncode == 0, other.stderr
    assert other.stdout == ""  # the key was leased to the paying driver: not touched
    assert result.status == "approved"
    assert merchant.transactions() == {result.id: "approved"}
    assert merchant.charges() == {result.id: 1}


def proxy_url(proxy: ProxyThread) -> str:
    return f"http://127.0.0.1:{proxy.port}"
