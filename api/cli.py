"""The server's commands (SPEC §6): ``serve``, ``migrate``, ``admin …``, ``relay``,
``completer``, ``purge`` and ``export`` — what the server image runs (``python -m api …``).

``idempay`` is ``idempay_tools.cli``, which mounts this app and adds the tooling
(``simulate``, ``demo``, ``audit``, ``lake synth``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import sys
from datetime import date
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

import structlog
import typer

from api.acquirer.host.cli import app as acquirer_app
from api.config import GRACEFUL_SHUTDOWN_S, Settings
from api.logs import configure_logging

app = typer.Typer(no_args_is_help=True, add_completion=False, help="idempay command line.")
admin = typer.Typer(no_args_is_help=True, help="Administration.")
app.add_typer(admin, name="admin")
app.add_typer(acquirer_app, name="acquirer")
key_admin = typer.Typer(no_args_is_help=True, help="Support tools for one idempotency key.")
admin.add_typer(key_admin, name="key")
webhook_admin = typer.Typer(no_args_is_help=True, help="Merchants' webhook endpoints.")
admin.add_typer(webhook_admin, name="webhook")

LakeOption = Annotated[Path, typer.Option("--lake", help="Lake root directory.")]


def parse_day(value: str, option: str) -> date:
    """A ``YYYY-MM-DD`` option, or a usage error naming ``option``."""
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"expected YYYY-MM-DD, got {value!r}", param_hint=option) from None


@app.command("export")
def export_command(
    day: Annotated[str, typer.Option("--date", help="UTC day to export, YYYY-MM-DD.")],
    lake_dir: LakeOption,
) -> None:
    """Write one UTC day of request events, transactions and ledger entries to the lake."""
    from api.db import create_engine
    from api.events.export import ExportRefusedError, export_day

    settings = Settings()
    when = parse_day(day, "--date")

    def say_waiting(message: str) -> None:
        typer.echo(message, err=True)

    async def run() -> Any:
        engine = create_engine(settings)
        try:
            return await export_day(engine, lake_dir, when, on_wait=say_waiting)
        finally:
            await engine.dispose()

    try:
        result = asyncio.run(run())
    except ExportRefusedError as exc:
        typer.echo(f"export refused: {exc}", err=True)
        raise typer.Exit(2) from None
    for table, path in result.files.items():
        kept = result.kept_from_lake.get(table, 0)
        note = f" ({kept} kept from the lake, no longer in the database)" if kept else ""
        typer.echo(f"{table}: {result.rows[table]} rows{note} → {path}")
    typer.echo(f"request events marked exported: {result.marked}")


def _prepare_multiprocess_metrics() -> None:
    """Before the workers start: an empty folder where each writes its metric values, named
    in the environment they inherit, so /metrics sums every worker (api/metrics.py). Done
    without importing prometheus_client here, which reads the variable at import."""
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    directory = Path(given) if given else Path(tempfile.mkdtemp(prefix="idempay-metrics-"))
    if not given:  # ours: gone when serve returns (uvicorn stops its workers first)
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):  # a previous run's values
        stale.unlink()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)


# What the default worker count may spend of Postgres' connections (its default
# max_connections is 100; the rest is for the completer, the relay, migrations and psql).
DEFAULT_CONNECTION_BUDGET = 90


def default_workers(settings: Settings) -> int:
    """One worker per usable core on Postgres, as many as ``DEFAULT_CONNECTION_BUDGET``
    allows at ``IDEMPAY_DB_POOL_SIZE`` each; one on the embedded SQLite, whose single
    database file has one writer: the group-commit writer thread batches within a process,
    and a second process would only queue on the same write lock."""
    if settings.is_sqlite:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, DEFAULT_CONNECTION_BUDGET // settings.db_pool_size))


DEV_SECRET_KEY: str = Settings.model_fields["secret_key"].default
ALLOW_DEV_SECRET = "--allow-dev-secret"


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1). Anything else — 0.0.0.0, a
    LAN address, a host name — may be reachable from another machine."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def without_password(url: str) -> str:
    """``url`` with the password of its user info left out (``scheme://user@host/…``); a URL
    without one (SQLite's, a Redis without AUTH) as it is."""
    parts = urlsplit(url)
    if not parts.netloc or "@" not in parts.netloc:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    netloc = f"{user}@{hostport}" if user else hostport
    return urlunsplit(parts._replace(netloc=netloc))


def startup_line(
    settings: Settings, *, host: str, port: int, workers: int, acquirer: str
) -> tuple[str, dict[str, Any]]:
    """The one line ``serve`` logs before it starts: where it listens and what it uses (no
    password), and whether the secret key is still the development default."""
    url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
    database = without_password(settings.resolved_database_url)
    redis = without_password(settings.redis_url) if settings.redis_url else "none"
    dev_secret = settings.secret_key == DEV_SECRET_KEY
    message = (
        f"idempay serving {url} — database {database}, Redis {redis}, acquirer {acquirer},"
        f" workers {workers}"
    )
    if dev_secret:
        message += (
            "; IDEMPAY_SECRET_KEY is the development default: set it before serving anything"
            " but this machine"
        )
    fields: dict[str, Any] = {
        "url": url,
        "database": database,
        "redis": redis,
        "acquirer": acquirer,
        "workers": workers,
        "secret_key": "development default" if dev_secret else "set",
    }
    return message, fields


def refuse_dev_secret(host: str, settings: Settings, *, allowed: bool) -> str | None:
    """Why ``serve`` must not start, or None: a bind another machine may reach while
    ``IDEMPAY_SECRET_KEY`` is the published development default (it keys the card
    fingerprints and the acquirer's retrieval references), unless ``--allow-dev-secret``."""
    if allowed or is_loopback(host) or settings.secret_key != DEV_SECRET_KEY:
        return None
    return (
        f"idempay serve: refusing to bind {host}: IDEMPAY_SECRET_KEY is the development"
        " default, which anyone can read in the source. Set IDEMPAY_SECRET_KEY to a long random"
        " string (and keep it stable: docs/operations.md), bind 127.0.0.1, or pass"
        f" {ALLOW_DEV_SECRET} for a throwaway server."
    )


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8000,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="uvicorn worker processes (default: one per core on Postgres, within 90"
            " connections at IDEMPAY_DB_POOL_SIZE each; 1 on the embedded SQLite).",
        ),
    ] = None,
    migrate_first: Annotated[bool, typer.Option("--migrate/--no-migrate")] = True,
    allow_dev_secret: Annotated[
        bool,
        typer.Option(
            ALLOW_DEV_SECRET,
            help="Bind a non-loopback --host even though IDEMPAY_SECRET_KEY is the development"
            " default (refused without it). For a throwaway server only.",
        ),
    ] = False,
) -> None:
    """Run the API (applies pending migrations first)."""
    from api.migrate import migrate
    from api.pg_checks import warn_about_postgres

    settings = Settings()
    refusal = refuse_dev_secret(host, settings, allowed=allow_dev_secret)
    if refusal is not None:
        typer.echo(refusal, err=True)
        raise typer.Exit(2)
    if migrate_first:
        migrate(settings)
    warn_about_postgres(settings)
    workers = workers or default_workers(settings)
    if workers > 1:
        _prepare_multiprocess_metrics()
    child = None
    if not settings.acquirer_url:  # the embedded default: one simulated host for all workers
        from api.acquirer.runtime import ChildHost

        child = ChildHost.start(
            settings.var_dir / "acquirer.sqlite3", slow_seconds=settings.acquirer_slow_seconds
        )
        os.environ["IDEMPAY_ACQUIRER_URL"] = child.url
    acquirer = (
        f"{child.url} (simulated host, a child process)"
        if child is not None
        else without_password(str(settings.acquirer_url))
    )
    # the start-up line is a record of the server's log (one JSON record per line)
    configure_logging(settings)
    message, fields = startup_line(
        settings, host=host, port=port, workers=workers, acquirer=acquirer
    )
    logger = structlog.get_logger("idempay.serve")
    say = logger.warning if fields["secret_key"] == "development default" else logger.info
    say(message, **fields)
    try:
        _run_uvicorn(host, port, workers)
    finally:
        if child is not None:
            child.stop()


def _run_uvicorn(host: str, port: int, workers: int) -> None:
    import uvicorn

    uvicorn.run(
        "api.main:app_factory",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        loop="uvloop",
        # httptools plus a header deadline, a header size cap and problem+json protocol
        # errors (api/http_limits.py; docs/security.md, "Slow clients"). No limit_concurrency:
        # its 503 would let a few slow connections turn normal requests away.
        http="api.http_limits:SlowClientHttpToolsProtocol",
        access_log=False,
        log_level="warning",
        timeout_keep_alive=30,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )


@app.command("migrate")
def migrate_command() -> None:
    """Apply Alembic migrations to the configured database."""
    from api.migrate import migrate
    from api.pg_checks import warn_about_postgres

    settings = Settings()
    migrate(settings)
    typer.echo(f"migrated {settings.resolved_database_url.split('@')[-1]}")
    warn_about_postgres(settings)


@admin.command("create-key")
def create_key(
    merchant: Annotated[str, typer.Option(help="Merchant name (created if new).")],
) -> None:
    """Create an API key for a merchant; the key is the last line printed."""
    from api.auth import create_api_key
    from api.db import create_engine
    from api.migrate import migrate

    settings = Settings()
    migrate(settings)

    async def run() -> str:
        engine = create_engine(settings)
        try:
            return await create_api_key(engine, merchant)
        finally:
            await engine.dispose()

    api_key = asyncio.run(run())
    typer.echo(f"merchant: {merchant}")
    typer.echo(api_key)


@admin.command("new-epoch")
def new_epoch() -> None:
    """Renew the database's epoch after a restore: every Redis entry cached before it is
    never served again (SPEC §3.6). Run it on the restored database before serving."""
    from api.db import create_engine
    from api.idempotency.epoch import renew_epoch
    from api.migrate import migrate

    settings = Settings()
    migrate(settings)

    async def run() -> tuple[str | None, str]:
        engine = create_engine(settings)
        try:
            return await renew_epoch(engine)
        finally:
            await engine.dispose()

    old, new = asyncio.run(run())
    typer.echo(f"previous epoch: {old or '-'}")
    typer.echo(f"new epoch: {new}")
    if settings.redis_url:
        told = asyncio.run(_announce_epoch(settings, new))
        typer.echo(
            "Redis told: running servers re-read the epoch before serving from the cache"
            if told
            else "Redis not reachable: running servers follow within 5 s (stop them first)"
        )


async def _announce_epoch(settings: Settings, epoch: str) -> bool:
    """Tell running servers through Redis: a cache read that meets another epoch than its
    own serves nothing and re-reads the database's (SPEC §3.6). Kept as long as a response."""
    import redis.asyncio as aioredis

    from api.idempotency.cache import announcement_of

    client = aioredis.from_url(settings.redis_url or "", socket_timeout=settings.redis_timeout)
    try:
        await client.set(
            f"{settings.redis_prefix}epoch",
            announcement_of(epoch),
            ex=max(1, int(settings.cache_ttl)),
        )
        return True
    except (aioredis.RedisError, OSError):
        return False
    finally:
        await client.aclose()


@admin.command("list-keys")
def list_keys(
    merchant: Annotated[str | None, typer.Option(help="Only this merchant's keys.")] = None,
) -> None:
    """List API keys: merchant, key id, first 8 characters, created, revoked (never the key)."""
    from api.auth import list_api_keys
    from api.db import create_engine

    async def run() -> None:
        engine = create_engine(Settings())
        try:
            for key in await list_api_keys(engine, merchant):
                revoked = key.revoked_at.isoformat() if key.revoked_at else "active"
                typer.echo(
                    f"{key.merchant}\t{key.id}\t{key.prefix}…\t"
                    f"{key.created_at.isoformat()}\t{revoked}"
                )
        finally:
            await engine.dispose()

    asyncio.run(run())


@admin.command("acquirer-queue")
def acquirer_queue(
    all_: Annotated[
        bool, typer.Option("--all", help="Acknowledged advices too (default: queued only).")
    ] = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many rows.")] = 100,
) -> None:
    """The reversal-advice queue toward the acquirer (0420/0421 until a 0430): depth, oldest
    age, then one line per advice — kind, merchant, key, rrn, amount, attempts, next
    attempt, last error, acknowledged."""
    from api.acquirer import advice
    from api.db import utcnow

    async def work(engine: Any) -> None:
        async with engine.connect() as conn:
            await conn.execution_options(sqlite_deferred_begin=True)  # a read: never refused
            depth, oldest = await advice.depth(conn, now=utcnow())
            rows = await advice.listing(conn, pending_only=not all_, limit=limit)
        typer.echo(f"queued {depth}\toldest {oldest:.1f} s")
        for row in rows:
            acknowledged = row.acknowledged_at.isoformat() if row.acknowledged_at else "queued"
            typer.echo(
                f"{row.kind}\t{row.merchant_id}\t{row.key}\t{row.rrn}\t"
                f"{row.amount} {row.currency}\tattempts {row.attempts}\t"
                f"next {row.next_attempt_at.isoformat()}\t{row.last_error or '-'}\t{acknowledged}"
            )

    _with_engine(work)


@admin.command("revoke-key")
def revoke_key(
    prefix: Annotated[
        str, typer.Option(help="The key id, the key's first 8 characters, or the whole key.")
    ],
    merchant: Annotated[str | None, typer.Option(help="The key's merchant.")] = None,
) -> None:
    """Revoke one API key; it stops working within a minute (per-process auth cache)."""
    from api.auth import revoke_api_key
    from api.db import create_engine

    if len(prefix) < 8:
        raise typer.BadParameter("give the key id, the first 8 characters, or the whole key")

    async def run() -> int:
        engine = create_engine(Settings())
        try:
            matches = await revoke_api_key(engine, prefix=prefix, merchant=merchant)
        finally:
            await engine.dispose()
        if not matches:
            typer.echo("no active key matches; nothing revoked", err=True)
            return 1
        if len(matches) > 1:
            typer.echo("several active keys match; nothing revoked. Give --merchant or the key id:",
                       err=True)  # fmt: skip
            for key in matches:
                typer.echo(f"  {key.merchant}\t{key.id}\t{key.prefix}…", err=True)
            return 1
        typer.echo(f"revoked {matches[0].id} ({matches[0].merchant}, {matches[0].prefix}…)")
        return 0

    raise typer.Exit(asyncio.run(run()))


MerchantArg = Annotated[str, typer.Argument(help="The merchant's name or id.")]
KeyArg = Annotated[str, typer.Argument(help="The idempotency key (a UUID).")]
ReasonOption = Annotated[str, typer.Option("--reason", help="Why (recorded in the outbox event).")]


def _parse_key(key: str) -> str:
    from api.errors import IdempotencyKeyInvalidError
    from api.idempotency.keys import parse_uuid

    try:
        return parse_uuid(key)
    except IdempotencyKeyInvalidError:
        raise typer.BadParameter("expected a UUID", param_hint="KEY") from None


@key_admin.command("show")
def key_show(merchant: MerchantArg, key: KeyArg) -> None:
    """A key's state, lease, attempts, transaction, ledger entries, request and outbox events."""
    from api.db import create_engine
    from api.transactions.merchants import UnknownMerchantError
    from api.transactions.operator import describe, report

    async def run() -> list[str]:
        engine = create_engine(Settings())
        try:
            return describe(await report(engine, merchant, _parse_key(key)))
        finally:
            await engine.dispose()

    try:
        lines = asyncio.run(run())
    except UnknownMerchantError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    typer.echo("\n".join(lines))


def _key_action(action: Any, merchant: str, key: str, reason: str) -> None:
    from api.main import build_context
    from api.transactions.merchants import UnknownMerchantError
    from api.transactions.operator import act, verdict
    from api.transactions.outcome import Outcome

    if not reason.strip():
        raise typer.BadParameter("say why", param_hint="--reason")
    settings = Settings()
    configure_logging(settings, stream=sys.stderr)  # stdout carries the verdict alone
    parsed = _parse_key(key)

    async def run() -> Outcome:
        ctx = await build_context(settings)  # the service as the server builds it
        try:
            return await act(ctx.service, merchant, parsed, action=action, reason=reason)
        finally:
            await ctx.close()

    try:
        outcome = asyncio.run(run())
    except UnknownMerchantError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    message, done = verdict(action, outcome)
    typer.echo(message, err=not done)
    raise typer.Exit(0 if done else 1)


@key_admin.command("fence")
def key_fence(merchant: MerchantArg, key: KeyArg, reason: ReasonOption) -> None:
    """Fence a key as the terminal's abort does: only if nothing was processed under it."""
    _key_action("fence", merchant, key, reason)


@key_admin.command("reverse")
def key_reverse(merchant: MerchantArg, key: KeyArg, reason: ReasonOption) -> None:
    """Reverse the key's approved transaction (exactly once), as the reversal route does."""
    _key_action("reverse", merchant, key, reason)


@admin.command("guard")
def guard_command(
    merchant: MerchantArg,
    window: Annotated[
        int | None,
        typer.Option(
            "--window",
            min=1,
            max=86_400,
            help="Turn the guard on with this window in seconds (contract §5's is 120).",
        ),
    ] = None,
    on: Annotated[bool, typer.Option("--on", help="Turn the guard on (window 120 s).")] = False,
    off: Annotated[bool, typer.Option("--off", help="Turn the guard off.")] = False,
) -> None:
    """Show or set the merchant's duplicate guard: a new purchase of the same card, amount
    and terminal within the window of an approved one answers 409 suspected_duplicate unless
    the body says "allow_duplicate": true (contract §2.2). Off by default. Servers apply a
    change within a minute (their API-key cache)."""
    from api.transactions.guard import DEFAULT_WINDOW_S, describe, set_window, setting
    from api.transactions.merchants import UnknownMerchantError

    if off and (on or window is not None):
        raise typer.BadParameter("--off cannot be combined with --on or --window")
    change = on or off or window is not None
    wanted = None if off else (window or DEFAULT_WINDOW_S)
    try:
        if change:
            shown = _with_engine(lambda engine: set_window(engine, merchant, wanted))
        else:
            shown = _with_engine(lambda engine: setting(engine, merchant))
    except UnknownMerchantError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    typer.echo(describe(shown))
    if change:
        typer.echo("running servers apply it within a minute (their API-key cache)")


def _with_engine(work: Any) -> Any:
    """Run ``work(engine)`` on the configured database."""
    from api.db import create_engine

    async def run() -> Any:
        engine = create_engine(Settings())
        try:
            return await work(engine)
        finally:
            await engine.dispose()

    return asyncio.run(run())


def _moment(value: str, option: str) -> Any:
    from datetime import UTC, datetime

    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(
            f"expected an ISO time, got {value!r}", param_hint=option
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@webhook_admin.command("add")
def webhook_add(
    merchant: MerchantArg,
    url: Annotated[str, typer.Argument(help="The receiver's http(s) URL.")],
    secret: Annotated[str | None, typer.Option(help="Signing secret (default: new).")] = None,
) -> None:
    """Deliver the merchant's events from now on to URL; the signing secret is the last line."""
    from api.webhooks.endpoints import add

    try:
        endpoint, signing = _with_engine(lambda engine: add(engine, merchant, url, secret=secret))
    except (LookupError, ValueError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    typer.echo(f"endpoint: {endpoint.id} ({endpoint.merchant} → {endpoint.url})")
    typer.echo(signing)


@webhook_admin.command("list")
def webhook_list(
    merchant: Annotated[str | None, typer.Option(help="Only this merchant's.")] = None,
) -> None:
    """Active endpoints: id, merchant, URL, created (never the secret)."""
    from api.webhooks.endpoints import list_endpoints

    for row in _with_engine(lambda engine: list_endpoints(engine, merchant)):
        typer.echo(f"{row.id}\t{row.merchant}\t{row.url}\t{row.created_at.isoformat()}")


@webhook_admin.command("remove")
def webhook_remove(endpoint_id: Annotated[str, typer.Argument(help="The endpoint's id.")]) -> None:
    """Stop delivering to an endpoint."""
    from api.webhooks.endpoints import UnknownEndpointError, remove

    try:
        _with_engine(lambda engine: remove(engine, endpoint_id))
    except UnknownEndpointError:
        typer.echo(f"no active endpoint {endpoint_id}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"removed {endpoint_id}")


@webhook_admin.command("dead-letters")
def webhook_dead_letters(
    merchant: Annotated[str | None, typer.Option(help="Only this merchant's.")] = None,
) -> None:
    """Events given up on after 3 days of failures: endpoint, event id, seq, attempts, error."""
    from api.webhooks.endpoints import dead_letters

    for row in _with_engine(lambda engine: dead_letters(engine, merchant)):
        typer.echo(
            f"{row.endpoint_id}\t{row.event_id}\t{row.seq}\t{row.attempts}\t{row.last_error}"
        )


@webhook_admin.command("replay")
def webhook_replay(
    endpoint_id: Annotated[str, typer.Argument(help="The endpoint's id.")],
    start: Annotated[str, typer.Option("--from", help="ISO time (UTC if no offset).")],
    end: Annotated[str, typer.Option("--to", help="ISO time, exclusive.")],
) -> None:
    """Send again the events that occurred in [--from, --to), dead letters included."""
    from api.webhooks.endpoints import UnknownEndpointError, replay

    since, until = _moment(start, "--from"), _moment(end, "--to")
    try:
        count = _with_engine(lambda engine: replay(engine, endpoint_id, since, until))
    except UnknownEndpointError:
        typer.echo(f"no active endpoint {endpoint_id}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"queued {count} event(s) again for {endpoint_id}")


@app.command()
def webhooks(
    once: Annotated[bool, typer.Option("--once", help="One tick, then exit.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds per delivery attempt.")] = 10.0,
    interval: Annotated[float, typer.Option(help="Seconds between idle ticks.")] = 1.0,
) -> None:
    """Deliver outbox events to merchants' webhook endpoints (at least once, in order)."""
    import httpx

    from api.webhooks.worker import WebhookWorker

    configure_logging(Settings())

    async def work(engine: Any) -> None:
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
            worker = WebhookWorker(engine, client)
            if once:
                typer.echo(f"attempted {await worker.run_once()}")
            else:
                await worker.run_forever(interval=interval)

    _with_engine(work)


@app.command()
def relay(
    once: Annotated[bool, typer.Option("--once", help="Publish one batch and exit.")] = False,
    metrics_port: Annotated[
        int, typer.Option(help="Serve the relay's Prometheus metrics on this port (0: off).")
    ] = 0,
) -> None:
    """Publish outbox events to the Redis Stream (at least once, in order per merchant)."""
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port)  # the stream's length, age and bound (docs/operations)
    from api.db import create_engine
    from api.main import create_redis
    from api.outbox.relay import Relay

    settings = Settings()
    if not settings.redis_url:
        raise typer.BadParameter("the relay publishes to Redis: set IDEMPAY_REDIS_URL")
    configure_logging(settings)  # JSON lines, like the API's

    async def run() -> None:
        engine = create_engine(settings)
        redis = create_redis(settings)
        worker = Relay(
            engine,
            redis,
            stream=settings.stream,
            batch=settings.relay_batch,
            mark_delay=settings.relay_mark_delay,
            lease=settings.relay_lease,
        )
        try:
            if once:
                typer.echo(f"published {await worker.run_once()}")
            else:
                await worker.run_forever()
        finally:
            await engine.dispose()
            if redis is not None:
                await redis.aclose()

    asyncio.run(run())


@app.command()
def completer() -> None:
    """Run only the completer (settle keys whose lease expired: declined / acquirer_timeout
    with a reversal advice; an offline sale's advice repeated)."""
    from api.main import build_context
    from api.transactions.completer import Completer

    settings = Settings()
    configure_logging(settings)  # JSON lines, like the API's

    async def run() -> None:
        ctx = await build_context(settings)
        try:
            await Completer(ctx.service, interval=settings.completer_interval).run_forever()
        finally:
            await ctx.acquirer.close()
            await ctx.engine.dispose()

    asyncio.run(run())


@app.command()
def purge() -> None:
    """Apply the retention policy now (tombstones, exported request events, sent outbox)."""
    from api.db import create_engine
    from api.retention import purge as run_purge

    settings = Settings()

    async def run() -> None:
        engine = create_engine(settings)
        try:
            report = await run_purge(
                engine,
                retention_seconds=settings.tombstone_retention,
                tolerance_seconds=settings.clock_skew_tolerance,
            )
        finally:
            await engine.dispose()
        typer.echo(
            f"purged tombstones={report.tombstones} request_events={report.request_events} "
            f"outbox_events={report.outbox_events} "
            f"webhook_deliveries={report.webhook_deliveries}"
        )

    asyncio.run(run())


def main() -> None:
    app()
