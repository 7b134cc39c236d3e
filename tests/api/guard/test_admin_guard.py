"""``idempay admin guard MERCHANT [--window S | --on | --off]`` on both backends: shows the
setting, turns it on and off, refuses a bad window and an unknown merchant; and the
migration (0010) goes down and up again."""

from __future__ import annotations

import uuid

from alembic import command
from typer.testing import CliRunner, Result

from api.cli import app
from api.config import Settings
from api.migrate import alembic_config, migrate
from tests.api.conftest import Deployment
from tests.support.backend import Backend
from tests.support.client import Api, assert_problem, body


def idempay(backend: Backend, *args: str) -> Result:
    return CliRunner().invoke(app, ["admin", "guard", *args], env=backend.env)


def window_of(backend: Backend, merchant: str) -> object:
    rows = backend.sql("SELECT duplicate_guard_s FROM merchant WHERE name = :n", n=merchant)
    return rows[0][0]


def test_admin_guard_shows_sets_and_clears(private_backend: Backend) -> None:
    merchant = "guard-admin"
    private_backend.api_key(merchant)
    shown = idempay(private_backend, merchant)
    assert shown.exit_code == 0, shown.stderr
    assert "duplicate guard off" in shown.stdout
    assert window_of(private_backend, merchant) is None

    on = idempay(private_backend, merchant, "--window", "90")
    assert on.exit_code == 0, on.stderr
    assert "on, window 90 s" in on.stdout
    assert window_of(private_backend, merchant) == 90

    by_id = private_backend.sql("SELECT id FROM merchant WHERE name = :n", n=merchant)[0][0]
    again = idempay(private_backend, str(by_id))  # the merchant's id works as well
    assert "on, window 90 s" in again.stdout

    default = idempay(private_backend, merchant, "--on")
    assert "on, window 120 s" in default.stdout
    assert window_of(private_backend, merchant) == 120

    off = idempay(private_backend, merchant, "--off")
    assert off.exit_code == 0, off.stderr
    assert "duplicate guard off" in off.stdout
    assert window_of(private_backend, merchant) is None

    assert idempay(private_backend, merchant, "--window", "0").exit_code == 2
    assert idempay(private_backend, merchant, "--off", "--window", "5").exit_code == 2
    unknown = idempay(private_backend, "nobody-by-that-name")
    assert unknown.exit_code == 1
    assert "no merchant named" in unknown.stderr
    assert window_of(private_backend, merchant) is None  # nothing refused changed anything


def test_migration_0010_goes_down_and_up(private_backend: Backend) -> None:
    settings: Settings = private_backend.settings
    private_backend.api_key("guard-mig")
    private_backend.sql("UPDATE merchant SET duplicate_guard_s = 60")
    command.downgrade(alembic_config(settings), "0009")
    columns = private_backend.sql('SELECT * FROM "transaction" LIMIT 0')  # still readable
    assert columns == []
    migrate(settings)
    rows = private_backend.sql("SELECT duplicate_guard_s FROM merchant WHERE name = 'guard-mig'")
    assert rows == [(None,)]  # down dropped the column: every guard off again
    indexes = private_backend.sql(
        "SELECT name FROM sqlite_master WHERE type = 'index'"
        if private_backend.name == "sqlite"
        else "SELECT indexname FROM pg_indexes WHERE tablename = 'transaction'"
    )
    assert ("ix_transaction_duplicate_guard",) in [tuple(row) for row in indexes]
    if private_backend.name == "postgres":
        found = private_backend.sql(
            "SELECT idempay_duplicate_of('m', 't', 'f', 1, 'BRL', now(), now(), 'k', 7)"
        )
        assert found == [(None,)]


def test_a_real_server_obeys_the_command(deployment: Deployment) -> None:
    """The operator's command, then a real server (uvicorn, the lean route): a merchant
    whose guard the command turned on before its key's first request is guarded, with the
    shape of the answer the SDK relies on; a replay of the override replays."""
    backend = deployment.backend
    merchant = f"guard-real-{uuid.uuid4().hex[:8]}"
    api = Api(deployment.server.url, backend.api_key(merchant))
    assert idempay(backend, merchant, "--window", "60").exit_code == 0
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    assert api.create(first).status_code == 201
    refused = api.create(second)
    problem = assert_problem(refused, 409, "suspected_duplicate")
    assert problem["duplicate_of"] == first
    assert refused.headers["Idempotency-Status"] == "not_found"
    assert api.lookup(second).status_code == 404
    confirmed = api.create(second, body(allow_duplicate=True))
    assert confirmed.status_code == 201, confirmed.text
    replay = api.create(second)
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.content == confirmed.content
    rows = backend.sql('SELECT duplicate_override FROM "transaction" WHERE id = :k', k=second)
    assert [bool(row[0]) for row in rows] == [True]


def test_a_merchant_id_wins_over_another_merchants_name_equal_to_it(
    private_backend: Backend,
) -> None:
    """A merchant whose *name* is another's id: the id names the other one, always (before,
    the row order decided which merchant the command changed — hostile review, session 5)."""
    owner = f"guard-owner-{uuid.uuid4().hex[:6]}"
    private_backend.api_key(owner)
    owner_id = str(private_backend.sql("SELECT id FROM merchant WHERE name = :n", n=owner)[0][0])
    private_backend.api_key(owner_id)  # a second merchant, named like the first one's id
    on = idempay(private_backend, owner_id, "--window", "60")
    assert on.exit_code == 0, on.stderr
    assert f"{owner} ({owner_id})" in on.stdout
    assert window_of(private_backend, owner) == 60
    assert window_of(private_backend, owner_id) is None  # the merchant *named* so: untouched
