"""CPU µs per create by layer, and SQL round trips per create, on Postgres and on SQLite.

    python -m loadtest.bench_profile_layers [--backend postgres sqlite] [--seconds 10]
                                            [--concurrency 50] [--raw-dir DIR] [--json F]

Per backend: one ``idempay serve`` worker (the bench's settings: rate limits lifted, log
level WARNING, no Redis) on a private database, a closed loop of creates from the bench's
generator in its own process, and ``py-spy record -r 200 -f raw`` on the server for
``--seconds`` while the server's CPU is read from ``/proc``. CPU µs per create = server CPU
in the window ÷ creates in the window; each layer gets its share of py-spy's samples
(``loadtest/_bench_layers.py`` says which frame goes where).

Round trips: the same app in-process (``httpx.ASGITransport``), 300 sequential creates after
100 warm-up ones. Statements are counted from SQLAlchemy's ``before_cursor_execute`` events
(the SQL the request path issues, BEGIN IMMEDIATE included on SQLite); the wire is counted
apart: on Postgres the engine connects through a counting TCP relay on loopback (one round
trip = one client write the server must answer before asyncpg sends the next), on SQLite
each ``aiosqlite`` call handed to its worker thread (statement, fetch, commit, cursor) is one
hop. Request-event flushes (one batch for all 300 creates here) are counted apart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from loadtest import _bench_layers as layers
from loadtest import _bench_peers as peers
from loadtest import _bench_profile as profiling
from loadtest._bench_driver import Load, body_for, run_load
from loadtest._bench_env import (
    Server,
    create_database,
    database_url,
    drop_database,
    prepare_database,
    sample_cpu,
    say,
)


def _profile(server: Server, api_key: str, args: argparse.Namespace, raw: Path) -> dict[str, Any]:
    py_spy = profiling.find()
    assert py_spy, "py-spy is not installed"
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        pool.submit(run_load, Load(server.url, api_key, "create", 3.0, args.concurrency)).result()
        load = Load(server.url, api_key, "create", args.seconds + 4.0, args.concurrency)
        future = pool.submit(run_load, load)
        time.sleep(2.0)
        before = sample_cpu(server.pid, "-")
        spy = profiling.start(py_spy, server.pid, args.seconds, raw)
        spy.communicate(timeout=args.seconds + 60)
        after = sample_cpu(server.pid, "-")
        driven = future.result()
    rate = driven.requests / driven.elapsed_s
    window = after.wall - before.wall
    cpu_us = 1e6 * (after.server - before.server) / (rate * window)
    counts = layers.by_layer(raw.read_text())
    total = sum(counts.values()) or 1
    return {
        "creates_per_s": rate,
        "errors": driven.errors,
        "server_cores": (after.server - before.server) / window,
        "cpu_us_per_create": cpu_us,
        "samples": total,
        "layers": {
            name: {"pct": 100.0 * counts[name] / total, "us": cpu_us * counts[name] / total}
            for name in layers.LAYERS
        },
    }


class _Relay:
    """A loopback TCP relay to Postgres that counts the client's writes (its round trips)."""

    def __init__(self) -> None:
        self.writes = 0
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", 5432)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: bool) -> None:
            while data := await src.read(65536):
                self.writes += count
                dst.write(data)
                await dst.drain()
            dst.close()

        await asyncio.gather(
            pipe(reader, up_writer, True), pipe(up_reader, writer, False), return_exceptions=True
        )


def _count_aiosqlite_hops(counter: list[int]) -> Any:
    import aiosqlite.core

    original = aiosqlite.core.Connection._execute

    async def counted(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        counter[0] += 1
        return await original(self, fn, *args, **kwargs)

    aiosqlite.core.Connection._execute = counted
    return original


async def _round_trips(url: str, api_key: str, creates: int = 300) -> dict[str, Any]:
    import aiosqlite.core
    import httpx
    from sqlalchemy import event

    from api.config import Settings
    from api.main import create_app

    relay, hops = _Relay(), [0]
    if url.startswith("postgresql"):
        url = url.replace("127.0.0.1:5432", f"127.0.0.1:{await relay.start()}")
    original = _count_aiosqlite_hops(hops)
    settings = Settings(
        database_url=url,
        log_level="WARNING",
        rate_limit="1000000/second",
        rate_limit_terminal="1000000/second",
        completer_enabled=False,
    )
    app = create_app(settings)
    counts: Counter[str] = Counter()
    async with app.router.lifespan_context(app):
        engine = app.state.ctx.engine.sync_engine

        @event.listens_for(engine, "before_cursor_execute")
        def _statement(_c: Any, _cur: Any, sql: str, *_rest: Any) -> None:
            words = sql.split()
            table = next((w for w in words[1:6] if w.strip('"').islower()), "")
            counts[" ".join(words[:1]).upper() + " " + table.strip('"(')] += 1

        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:

            async def create(n: int) -> None:
                response = await client.post(
                    "/v1/transactions",
                    content=body_for(n),
                    headers={
                        "Authorization": f"Bearer {api_key}",
                        "Content-Type": "application/json",
                        "Idempotency-Key": str(uuid.uuid4()),
                    },
                )
                assert response.status_code == 201, response.text

            for n in range(100):
                await create(n)
            await app.state.ctx.events.drain()
            counts.clear()
            wire_before = relay.writes + hops[0]
            for n in range(creates):
                await create(n)
            wire = relay.writes + hops[0] - wire_before
            request_path = dict(counts)
            counts.clear()
            await app.state.ctx.events.drain()
            events = dict(counts)
    aiosqlite.core.Connection._execute = original
    if relay.server is not None:
        relay.server.close()
    per_create = {k: v / creates for k, v in sorted(request_path.items())}
    return {
        "creates": creates,
        "per_create": per_create,
        "statements_per_create": sum(per_create.values()),
        "round_trips_per_create": wire / creates,
        "round_trip_unit": "client writes to Postgres" if relay.server else "aiosqlite hops",
        "event_flush_total": events,
    }


def _backend(name: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    database = ""
    if name == "postgres":
        database = create_database()
        api_key = prepare_database(database)
        url = database_url(database)
    else:
        path = workdir / "sqlite" / "idempay.db"
        path.parent.mkdir()
        api_key = peers.prepare_sqlite(path)
        url = peers.sqlite_url(path)
    try:
        server = Server(database or "-", workdir / f"{name}.log", env={"IDEMPAY_DATABASE_URL": url})
        server.start()
        try:
            raw = (args.raw_dir or workdir) / f"create-{name}.pyspy.txt"
            profile = _profile(server, api_key, args, raw)
        finally:
            server.stop()
        trips = asyncio.run(_round_trips(url, api_key))
    finally:
        if database:
            drop_database(database)
    return {"profile": profile, "round_trips": trips}


def _print(name: str, result: dict[str, Any]) -> None:
    p, t = result["profile"], result["round_trips"]
    say(
        f"\n== {name}: {p['creates_per_s']:,.0f} creates/s under py-spy, "
        f"{p['server_cores']:.2f} server cores, {p['cpu_us_per_create']:,.0f} CPU µs/create, "
        f"{p['samples']:,} samples"
    )
    for layer, figure in sorted(p["layers"].items(), key=lambda kv: -kv[1]["us"]):
        say(f"  {layer:<20} {figure['us']:>7,.0f} µs  {figure['pct']:5.1f} %")
    say(
        f"  per create: {t['statements_per_create']:.2f} statements, "
        f"{t['round_trips_per_create']:.2f} round trips ({t['round_trip_unit']})"
    )
    for statement, count in t["per_create"].items():
        say(f"    {count:5.2f}  {statement}")
    say(f"  request-event flush for {t['creates']} creates: {t['event_flush_total']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_profile_layers")
    parser.add_argument("--backend", nargs="+", default=["postgres", "sqlite"])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--raw-dir", type=Path, help="keep py-spy's collapsed stacks here")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="idempay-layers-") as tmp:
        for name in args.backend:
            results[name] = _backend(name, args, Path(tmp))
            _print(name, results[name])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
