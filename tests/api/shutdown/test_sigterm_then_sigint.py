"""Review h11: SIGTERM (``systemctl stop``, a container stop) and then SIGINT (the operator's
Ctrl-C) while creates wait on a slow acquirer (``tok_issuer_slow``, answer window 10 s).

``_close_waiters_on_exit_signal`` counts SIGINTs only: after a SIGTERM the first SIGINT is
``interrupts == 1``, so it is chained to uvicorn, whose ``handle_exit`` sees
``should_exit`` already set and a SIGINT — "force exit". uvicorn skips the graceful wait
and its lifespan, then re-raises the captured SIGTERM: the process dies of it (rc -15).
Every create at work gets no HTTP answer at all (the connection closes: "Server
disconnected without sending a response"), no request event is written, and the keys stay
``processing`` until a restart recovers them (they do end declined/acquirer_timeout,
reversed — nothing is charged twice).

Contract §2: every response to create is a 201/202 or an RFC 9457 problem+json carrying
``Idempotency-Status``; the fix for SIGINT twice (answer in flight, then go on gracefully)
must hold for any exit signal followed by SIGINT. Seen twice on cc674b2 with real
processes (12 creates, all disconnected, server rc -15).
"""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import pytest

from tests.support.backend import Backend
from tests.support.client import body, card, new_key

pytestmark = pytest.mark.server


def test_creates_at_work_at_sigterm_then_sigint_are_answered_per_contract(
    private_sqlite_backend: Backend,
) -> None:
    backend = private_sqlite_backend
    api_key = backend.api_key("review-h11-term-int")
    server = backend.server(
        IDEMPAY_ANSWER_WITHIN="10",
        IDEMPAY_ACQUIRER_SLOW_SECONDS="6",
        IDEMPAY_ACQUIRER_TIMEOUT="4",
    )
    keys = [new_key() for _ in range(3)]

    async def run() -> list[httpx.Response | BaseException]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            pending = [
                asyncio.ensure_future(
                    client.post(
                        "/v1/transactions",
                        json=body(amount=100 + i, card=card("tok_issuer_slow")),
                        headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": k},
                    )
                )
                for i, k in enumerate(keys)
            ]
            await asyncio.sleep(1.5)
            assert server.proc is not None
            os.kill(server.proc.pid, signal.SIGTERM)
            await asyncio.sleep(0.5)
            os.kill(server.proc.pid, signal.SIGINT)
            return list(await asyncio.gather(*pending, return_exceptions=True))

    answers = asyncio.run(run())
    assert server.proc is not None
    server.proc.wait(40)
    for answer in answers:
        assert isinstance(answer, httpx.Response), f"no HTTP answer: {answer!r}"
        if answer.status_code not in (201, 202):
            assert answer.headers["content-type"].startswith("application/problem+json")
        assert answer.headers.get("Idempotency-Status") is not None
