"""``idempay``: one entry point to everything (SPEC §6)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from api.config import Settings

app = typer.Typer(no_args_is_help=True, add_completion=False, help="idempay command line.")
admin = typer.Typer(no_args_is_help=True, help="Administration.")
app.add_typer(admin, name="admin")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8000,
    workers: Annotated[int, typer.Option(min=1, help="uvicorn worker processes.")] = 1,
    migrate_first: Annotated[bool, typer.Option("--migrate/--no-migrate")] = True,
) -> None:
    """Run the API (applies pending migrations first)."""
    import uvicorn

    from api.migrate import migrate

    settings = Settings()
    if migrate_first:
        migrate(settings)
    uvicorn.run(
        "api.main:app_factory",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        timeout_keep_alive=30,
        timeout_graceful_shutdown=10,
    )


@app.command("migrate")
def migrate_command() -> None:
    """Apply Alembic migrations to the configured database."""
    from api.migrate import migrate

    settings = Settings()
    migrate(settings)
    typer.echo(f"migrated {settings.resolved_database_url.split('@')[-1]}")


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


def main() -> None:
    app()
