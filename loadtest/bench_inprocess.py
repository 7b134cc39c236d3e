"""The app's own CPU per request, without the network, uvicorn or the generator.

    python -m loadtest.bench_inprocess [--scenario create replay lookup] [--requests 4000]
                                       [--concurrency 50] [--rounds 3] [--backend postgres]
                                       [--cprofile F]

On a shared 2-core machine a request's CPU measured over HTTP moves with everything else
that runs (the generator, Postgres, other sessions' suites): the same code measured twice
differs by 10–20 %. Here the app (``create_app`` with the bench's settings: rate limits
lifted, log level WARNING, no Redis) runs in this process on uvloop, its lifespan entered,
and ``--concurrency`` tasks call it as uvicorn would — an ASGI ``http`` scope with the
bench's headers and body, ``receive`` handing over the body, ``send`` collecting the
answer — ``--requests`` times per round. What is measured is this process's CPU time (the
app, asyncpg's protocol, the event loop, the request-event writer; not Postgres) per
request. Every answer is checked (create 201, replay 201 with ``Idempotent-Replayed``,
lookup 200).

What it leaves out, and ``loadtest.bench_profile_layers`` still shows: uvicorn and httptools
(parsing, the response's bytes, the transport). ``--cprofile F`` writes a cProfile of the
last round (deterministic call counts; its own overhead inflates small functions).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from loadtest import _bench_peers as peers
from loadtest._bench_driver import TERMINALS, body_for
from loadtest._bench_env import create_database, database_url, drop_database, prepare_database, say


def _scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 40000),
        "scheme": "http",
        "method": method,
        "root_path": "",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers,
        "state": {},
    }


class _Client:
    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.auth = f"Bearer {api_key}".encode()

    async def call(self, method: str, path: str, key: str | None, body: bytes) -> tuple[int, dict]:
        headers = [(b"host", b"127.0.0.1:8000"), (b"authorization", self.auth)]
        if method == "POST":
            headers += [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"idempotency-key", (key or "").encode()),
            ]
        sent = False
        answer: dict[str, Any] = {}

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)  # no disconnect while the request runs
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                answer["headers"] = {k.lower(): v for k, v in message.get("headers", [])}

        await self.app(_scope(method, path, headers), receive, send)
        return answer["status"], answer["headers"]


async def _round(
    client: _Client, scenario: str, requests: int, concurrency: int, pool: list[str]
) -> tuple[float, list[int]]:
    bodies = [body_for(i) for i in range(TERMINALS)]
    counter = iter(range(requests))
    errors: list[int] = []

    async def worker() -> None:
        for n in counter:
            if scenario == "create":
                status, headers = await client.call(
                    "POST", "/v1/transactions", str(uuid.uuid4()), bodies[n % TERMINALS]
                )
                ok = status == 201
            elif scenario == "replay":
                index = n % len(pool)
                status, headers = await client.call(
                    "POST", "/v1/transactions", pool[index], bodies[index % TERMINALS]
                )
                ok = status == 201 and headers.get(b"idempotent-replayed") == b"true"
            else:
                key = pool[n % len(pool)]
                status, headers = await client.call("GET", f"/v1/transactions/{key}", None, b"")
                ok = status == 200
            if not ok:
                errors.append(status)

    started = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.process_time() - started, errors


async def _run(args: argparse.Namespace, url: str, api_key: str) -> dict[str, list[float]]:
    from api.config import Settings
    from api.main import create_app

    settings = Settings(
        database_url=url,
        log_level="WARNING",
        rate_limit="1000000/second",
        rate_limit_terminal="1000000/second",
        redis_url=None,
    )
    app = create_app(settings)
    results: dict[str, list[float]] = {name: [] for name in args.scenario}
    async with app.router.lifespan_context(app):
        client = _Client(app, api_key)
        pool = [str(uuid.uuid4()) for _ in range(500)]
        for index, key in enumerate(pool):  # the keys replay and lookup use
            status, _ = await client.call("POST", "/v1/transactions", key, body_for(index))
            assert status == 201, status
        for scenario in args.scenario:  # warm-up
            await _round(client, scenario, 500, args.concurrency, pool)
        profiler = cProfile.Profile(time.thread_time) if args.cprofile else None
        for number in range(args.rounds):
            for scenario in args.scenario:
                last = number == args.rounds - 1
                if profiler is not None and last:
                    profiler.enable()
                cpu, errors = await _round(client, scenario, args.requests, args.concurrency, pool)
                if profiler is not None and last:
                    profiler.disable()
                if errors:
                    raise RuntimeError(f"{scenario}: unexpected answers {sorted(set(errors))}")
                results[scenario].append(1e6 * cpu / args.requests)
        if profiler is not None:
            profiler.dump_stats(args.cprofile)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_inprocess")
    parser.add_argument("--scenario", nargs="+", default=["create", "replay", "lookup"])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--cprofile", type=Path, help="write a cProfile of the last round")
    args = parser.parse_args(argv)
    database = ""
    with tempfile.TemporaryDirectory(prefix="idempay-inprocess-") as tmp:
        try:
            if args.backend == "postgres":
                database = create_database()
                api_key, url = prepare_database(database), database_url(database)
            else:
                path = Path(tmp) / "idempay.db"
                api_key, url = peers.prepare_sqlite(path), peers.sqlite_url(path)
            import uvloop

            results = uvloop.run(_run(args, url, api_key))
        finally:
            if database:
                drop_database(database)
    for scenario, figures in results.items():
        rounds = " ".join(f"{value:,.0f}" for value in figures)
        say(
            f"{scenario:<7} CPU µs/request: median {statistics.median(figures):,.0f} "
            f"(rounds: {rounds})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
