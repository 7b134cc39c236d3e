"""``LossyTerminal``: a raw-HTTP terminal that resolves lost responses by key.

Per payment it mints a UUID and creates. A create or lookup with no HTTP answer (a real
link fault, e.g. from ``idempay_tools.chaos_proxy``) is in doubt; so is, with probability
``IDEMPAY_LT_LOSS`` (default 0.035), a 201 the terminal pretends it never received. In
doubt it looks the key up: 200 → done; 404 → resend the same request with the same key;
202/409 → wait ``Retry-After`` and look up again. A 404 after a 201 is a lost transaction.
Each payment is also reported as one ``PAY lossy payment`` event, failed when it did not
reach a definitive outcome within 30 s.
"""

from __future__ import annotations

import itertools
import os
import random
import time
from typing import Any

import gevent
from locust import between, task
from locust.contrib.fasthttp import FastHttpUser

from loadtest.scenarios._common import (
    CREATE,
    LOOKUP,
    api_key,
    check_transaction,
    create_headers,
    is_link_fault,
    new_key,
    payment,
    retry_after,
)
from loadtest.scenarios._events import fire_payment

PAYMENT_DEADLINE_S = 30.0
_ids = itertools.count(1)


class PaymentFailed(Exception):
    """A payment that did not end with a definitive, consistent outcome."""


class LossyTerminal(FastHttpUser):
    wait_time = between(0.1, 0.5)
    network_timeout = 10.0
    connection_timeout = 5.0

    def on_start(self) -> None:
        self.token = api_key()
        self.terminal_id = f"LT-{os.getpid()}-{next(_ids):04d}"
        self.rng = random.Random()
        self.loss = float(os.environ.get("IDEMPAY_LT_LOSS", "0.035"))

    @task
    def pay(self) -> None:
        started = time.perf_counter()
        key, body = new_key(), payment(self.terminal_id, self.rng)
        error: BaseException | None = None
        try:
            self._settle(key, body)
        except PaymentFailed as exc:
            error = exc
        fire_payment(self.environment, "lossy payment", started, error)

    def _settle(self, key: str, body: dict[str, Any]) -> None:
        deadline = time.monotonic() + PAYMENT_DEADLINE_S
        attempt, in_doubt, processed = 1, False, False
        while time.monotonic() < deadline:
            if not in_doubt:
                state = self._create(key, body, attempt)
                attempt += 1
            else:
                state = self._lookup(key, processed)
            if state == "done":
                return
            if state == "failed":
                raise PaymentFailed(key)
            if state == "pretend_lost":
                processed = True
            in_doubt = state != "resend"
        raise PaymentFailed(f"{key}: no definitive outcome in {PAYMENT_DEADLINE_S:.0f}s")

    def _create(self, key: str, body: dict[str, Any], attempt: int) -> str:
        headers = create_headers(self.token, key, attempt)
        with self.client.post(
            "/v1/transactions", json=body, headers=headers, name=CREATE, catch_response=True
        ) as resp:
            if is_link_fault(resp):
                return "in_doubt"
            if resp.status_code == 201:
                if not check_transaction(resp, key):
                    return "failed"
                return "pretend_lost" if self.rng.random() < self.loss else "done"
            if resp.status_code in (202, 409):
                resp.success()
                gevent.sleep(retry_after(resp))
                return "in_doubt"
            resp.failure(f"create: unexpected {resp.status_code} {resp.text[:200]}")
            return "failed"

    def _lookup(self, key: str, processed: bool) -> str:
        headers = {"Authorization": f"Bearer {self.token}"}
        with self.client.get(
            f"/v1/transactions/{key}", headers=headers, name=LOOKUP, catch_response=True
        ) as resp:
            if is_link_fault(resp):
                gevent.sleep(0.1)
                return "in_doubt"
            if resp.status_code == 200:
                return "done" if check_transaction(resp, key) else "failed"
            if resp.status_code == 404:
                if processed:
                    resp.failure("lookup 404 for a key answered 201: transaction lost")
                    return "failed"
                resp.success()
                return "resend"
            if resp.status_code in (202, 409):
                resp.success()
                gevent.sleep(retry_after(resp))
                return "in_doubt"
            resp.failure(f"lookup: unexpected {resp.status_code} {resp.text[:200]}")
            return "failed"
