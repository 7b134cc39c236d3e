"""``SdkTerminal``: a Locust user driving the real ``client_sdk.Client``.

Each user is one terminal with its own temporary journal. Every purchase is reported as
one ``SDK purchase`` request event with its end-to-end latency (retries, lookups and
resends included) and, when the SDK did not return approved/declined, the exception it
raised (``PaymentAborted``, ``PaymentInDoubt``, a typed ``APIError``, …).
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import shutil
import tempfile
import time

from locust import User, between, task

from client_sdk import Client
from loadtest.scenarios._common import api_key, payment
from loadtest.scenarios._events import fire_payment

_ids = itertools.count(1)
logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise


class SdkTerminal(User):
    wait_time = between(0.1, 0.5)

    def on_start(self) -> None:
        if not self.host:
            raise RuntimeError("SdkTerminal needs --host")
        self.terminal_id = f"SDK-{os.getpid()}-{next(_ids):04d}"
        self.rng = random.Random()
        self.workdir = tempfile.mkdtemp(prefix="idempay-locust-")
        self.pos = Client(
            self.host,
            api_key(),
            terminal_id=self.terminal_id,
            journal=os.path.join(self.workdir, "pos.db"),
            network="gprs",
            timeout=5.0,
            base_backoff=0.05,
            max_backoff=1.0,
        )

    def on_stop(self) -> None:
        self.pos.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    @task
    def purchase(self) -> None:
        body = payment(self.terminal_id, self.rng)
        started = time.perf_counter()
        error: BaseException | None = None
        try:
            result = self.pos.purchase(
                amount=body["amount"], currency=body["currency"], card=body["card"], deadline_s=30
            )
            if result.status not in ("approved", "declined"):
                error = RuntimeError(f"unexpected status {result.status!r}")
        except Exception as exc:  # reported to Locust as this payment's failure
            error = exc
        fire_payment(self.environment, "SDK purchase", started, error)
