"""CPU µs of each Python step of a create, each in isolation (no server, no database).

    python -m loadtest.bench_parts [--number 20000]

Each step runs ``--number`` times, three times over, timed by this process's CPU clock
(``time.process_time``: another process taking the core does not count, unlike wall time on
this shared machine); the best of the three is printed. The body is the bench's
(``loadtest._bench_driver.body_for``). What the HTTP layer, the event loop and the database
round trip add is not here: ``loadtest.bench_inprocess`` and ``loadtest.bench_profile_layers``
measure those.
"""

from __future__ import annotations

import argparse
import json
import time
import timeit
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any


def _cpu_us(step: Callable[[], Any], number: int) -> float:
    timer = timeit.Timer(step, timer=time.process_time)
    return min(timer.repeat(3, number)) / number * 1e6


def steps() -> list[tuple[str, Callable[[], Any]]]:
    from sqlalchemy.ext.asyncio import create_async_engine

    from api.config import Settings
    from api.idempotency.keys import body_fingerprint, parse_key
    from api.transactions import http, inline, repository
    from api.transactions.issuer import SimulatedIssuer
    from api.transactions.pan import contains_pan
    from api.transactions.schemas import TransactionCreate
    from api.transactions.service import TransactionService
    from loadtest._bench_driver import body_for

    raw = body_for(3)
    data = json.loads(raw)
    body = http.decode(raw)
    key = str(uuid.uuid4())
    url = "postgresql+asyncpg://bench@127.0.0.1/bench"  # never connected to
    engine = create_async_engine(url)
    service = TransactionService(
        engine, SimulatedIssuer(engine, slow_seconds=1.0), Settings(database_url=url)
    )
    now = datetime.now(UTC)
    rows = inline.build(service, "mer_bench", key, body, "fingerprint", now)
    auth = service.issuer.decide("issuer-key", body.card.token)  # type: ignore[attr-defined]
    return [
        ("validation: decode() in all", lambda: http.decode(raw)),
        (
            "  json.loads with the ambiguity hooks",
            lambda: json.loads(
                raw,
                parse_float=http._number,
                parse_constant=http._constant,
                object_pairs_hook=http._object,
            ),
        ),  # fmt: skip
        ("  (json.loads without hooks)", lambda: json.loads(raw)),
        ("  PAN scan (contains_pan)", lambda: contains_pan(data)),
        ("  duplicate names / non-finite walk", lambda: http._ambiguities(data)),
        ("  TransactionCreate.model_validate", lambda: TransactionCreate.model_validate(data)),
        ("fingerprint: body_fingerprint()", lambda: body_fingerprint(body)),
        ("parse_key", lambda: parse_key(key)),
        (
            "rows: inline.build() in all",
            lambda: inline.build(service, "mer_bench", key, body, "fingerprint", now),
        ),  # fmt: skip
        (
            "  service.new_transaction",
            lambda: service.new_transaction("mer_bench", key, body, auth, created_at=now),
        ),  # fmt: skip
        ("  repository.render", lambda: repository.render(rows.txn)),
        (
            "  inline.completed_event",
            lambda: inline.completed_event("mer_bench", key, rows.response_body, now),
        ),  # fmt: skip
        (
            "  issuer key + card fingerprint (2 HMACs)",
            lambda: (service.issuer_key("mer_bench", key), service.card_fingerprint("tok")),
        ),  # fmt: skip
        ("  str(uuid.uuid4())", lambda: str(uuid.uuid4())),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_parts")
    parser.add_argument("--number", type=int, default=20000)
    args = parser.parse_args(argv)
    for name, step in steps():
        print(f"{name:<45} {_cpu_us(step, args.number):7.2f} µs")  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
