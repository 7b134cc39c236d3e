"""Review finding A on a real server (its own completer loop and child acquirer host, both
backends): an offline advice whose acquirer never answers (``tok_issuer_down``) is still
``processing`` well past ``IDEMPAY_ISSUER_DEADLINE`` — lookups 202, a client's abort 409, its
0220 repeated as 0221s, never a 0200, never declined — while an online key with the same
card, on the same server, is settled declined / ``acquirer_timeout`` at the acquirer timeout
(one 0200, its 0420 reversal advice acknowledged)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from api.acquirer.host import store as acquirer_store
from api.acquirer.messages import rrn_for
from tests.support.backend import Backend
from tests.support.client import Api, assert_problem, body, card, new_key
from tests.support.eventually import eventually


def test_an_advice_outlives_the_issuer_deadline_an_online_key_does_not(
    private_backend: Backend,
) -> None:
    server = private_backend.server(IDEMPAY_ISSUER_DEADLINE="3", IDEMPAY_LEASE_SECONDS="1")
    api = Api(server.url, private_backend.api_key("merchant-a"))
    captured = (datetime.now(UTC) - timedelta(minutes=10)).isoformat()
    advice_key, online_key = new_key(), new_key()
    advice = body(card=card("tok_issuer_down"), entry_mode="offline", captured_at=captured)
    assert api.create(advice_key, advice).status_code == 202
    assert api.create(online_key, body(card=card("tok_issuer_down"))).status_code == 202
    # the control: settled in doubt at the acquirer timeout (3 s), not fenced
    settled = eventually(
        lambda: api.lookup(online_key),
        what="the online key settled",
        until=lambda r: r.status_code != 202,
        timeout=30,
    )
    assert settled.status_code == 200, settled.text
    assert (settled.json()["status"], settled.json()["decline_reason"]) == (
        "declined",
        "acquirer_timeout",
    )
    time.sleep(3)  # the advice: past its deadline (3 s) twice over now, repeated meanwhile
    looked = api.lookup(advice_key)
    assert looked.status_code == 202, looked.text
    assert looked.headers["idempotency-status"] == "in_progress"
    assert_problem(api.abort(advice_key), 409, "request_in_progress")
    [(state, merchant)] = private_backend.sql(
        "SELECT state, merchant_id FROM idempotency_key WHERE key = :k", k=advice_key
    )
    assert state == "processing"
    # at the acquirer (the server's child host): the advice went as a 0220, then 0221s —
    # never a 0200; the online key's one 0200 and its 0420
    host = private_backend.tmp / "var" / "acquirer.sqlite3"
    secret = private_backend.settings.secret_key.encode()
    advice_mtis = [
        m["mti"] for m in acquirer_store.messages(host, rrn=rrn_for(secret, merchant, advice_key))
    ]
    assert advice_mtis[0] == "0220" and len(advice_mtis) >= 2, advice_mtis
    assert set(advice_mtis[1:]) == {"0221"}, advice_mtis
    online_rrn = rrn_for(secret, merchant, online_key)
    acknowledged = eventually(
        lambda: private_backend.sql(
            "SELECT kind, acknowledged_at FROM acquirer_advice WHERE key = :k", k=online_key
        ),
        what="the online key's reversal advice acknowledged",
        until=lambda rows: len(rows) == 1 and rows[0][1] is not None,
        timeout=30,
    )
    assert acknowledged[0][0] == "timeout"
    online_mtis = [m["mti"] for m in acquirer_store.messages(host, rrn=online_rrn)]
    assert online_mtis.count("0200") == 1, online_mtis
    assert online_mtis[-1] in ("0420", "0421"), online_mtis
