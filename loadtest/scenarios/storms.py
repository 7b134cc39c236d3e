"""Storm scenarios: many users on the same few keys.

``DuplicateStorm``: every user hammers a handful of hot keys with the identical create
(the payload is derived from the key, so all users send the same body). The hot keys
rotate every ``HOT_KEY_PERIOD_S`` so the first-create race happens again and again.
Success: 201 (first or a replay carrying ``Idempotent-Replayed: true``), 409
``request_in_progress``, or 202 ``processing`` (the acquirer had not answered within the
server's ``IDEMPAY_ANSWER_WITHIN``); anything else fails.

``InDoubtStorm``: each user creates a batch of keys, except a share "lost in the outage"
that never reached the server; after the simulated outage it storms lookups over the
batch (200 — or 202 ``processing`` while the acquirer's answer is awaited — for sent keys,
404 only for the lost ones) and now and then resolves a lost key the way a terminal would:
404 → resend with the same key → 201 (or 202).
"""

from __future__ import annotations

import os
import random
import time
import uuid
from typing import Any

import gevent
from locust import between, constant, task
from locust.contrib.fasthttp import FastHttpUser

from loadtest.scenarios._common import (
    CREATE,
    LOOKUP,
    api_key,
    check_transaction,
    create_headers,
    is_processing,
    new_key,
    payment,
)

HOT_KEYS = 4
HOT_KEY_PERIOD_S = 2.0
BATCH = 20
LOST_SHARE = 0.3
OUTAGE_S = 1.0
_RUN = uuid.uuid4()  # per process: keys of separate runs never collide


def hot_key(slot: int, now: float) -> tuple[str, dict[str, Any]]:
    bucket = int(now // HOT_KEY_PERIOD_S)
    key = str(uuid.uuid5(_RUN, f"{slot}:{bucket}"))
    return key, payment("STORM-HOT", random.Random(key))


class DuplicateStorm(FastHttpUser):
    wait_time = constant(0)
    network_timeout = 10.0
    connection_timeout = 5.0

    def on_start(self) -> None:
        self.token = api_key()

    @task
    def duplicate(self) -> None:
        key, body = hot_key(random.randrange(HOT_KEYS), time.time())
        headers = create_headers(self.token, key, 1)
        with self.client.post(
            "/v1/transactions",
            json=body,
            headers=headers,
            name=f"{CREATE} [hot key]",
            catch_response=True,
        ) as resp:
            if resp.status_code == 201:
                check_transaction(resp, key)
            elif _in_flight(resp) or is_processing(resp, key):
                resp.success()
            else:
                resp.failure(f"duplicate create: {resp.status_code} {_code(resp)}")
        gevent.sleep(random.uniform(0.0, 0.02))


class InDoubtStorm(FastHttpUser):
    wait_time = between(0.01, 0.05)
    network_timeout = 10.0
    connection_timeout = 5.0

    def on_start(self) -> None:
        self.token = api_key()
        self.rng = random.Random()
        terminal = f"STORM-{os.getpid()}-{id(self) % 100_000}"
        self.payloads = {new_key(): payment(terminal, self.rng) for _ in range(BATCH)}
        self.lost: set[str] = set()
        for key, body in self.payloads.items():
            if self.rng.random() < LOST_SHARE:
                self.lost.add(key)  # the outage swallowed it before the server
            else:
                self._create(key, body, attempt=1, name=f"{CREATE} [batch]")
        gevent.sleep(OUTAGE_S)

    @task(10)
    def lookup(self) -> None:
        key = self.rng.choice(list(self.payloads))
        headers = {"Authorization": f"Bearer {self.token}"}
        with self.client.get(
            f"/v1/transactions/{key}", headers=headers, name=LOOKUP, catch_response=True
        ) as resp:
            waiting = key not in self.lost and is_processing(resp, key)  # at the acquirer
            if resp.status_code == 200:
                check_transaction(resp, key)
            elif waiting or (resp.status_code == 404 and key in self.lost):
                resp.success()
            elif resp.status_code == 404:
                resp.failure("lookup 404 for a key answered 201: transaction lost")
            else:
                resp.failure(f"lookup: unexpected {resp.status_code} {_code(resp)}")

    @task(1)
    def resolve_lost(self) -> None:
        if not self.lost:
            return
        key = self.lost.pop()
        status = self._create(key, self.payloads[key], attempt=2, name=f"{CREATE} [resend]")
        if status not in (201, 202):  # a 202 reached the server: the key is no longer lost
            self.lost.add(key)

    def _create(self, key: str, body: dict[str, Any], *, attempt: int, name: str) -> int:
        headers = create_headers(self.token, key, attempt)
        with self.client.post(
            "/v1/transactions", json=body, headers=headers, name=name, catch_response=True
        ) as resp:
            if resp.status_code == 201:
                check_transaction(resp, key)
            elif is_processing(resp, key):
                resp.success()
            else:
                resp.failure(f"create: {resp.status_code} {_code(resp)}")
            return int(resp.status_code)


def _in_flight(resp: Any) -> bool:
    return bool(resp.status_code == 409 and _code(resp) == "request_in_progress")


def _code(resp: Any) -> str | None:
    try:
        body = resp.json()
    except (ValueError, TypeError):
        return None
    return body.get("code") if isinstance(body, dict) else None
