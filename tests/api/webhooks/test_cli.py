"""`idempay admin webhook add|list|remove|dead-letters|replay` and `idempay webhooks --once`,
on both backends: a registered endpoint receives a real transaction's event, signed with
the secret the command printed."""

from __future__ import annotations

from typer.testing import CliRunner, Result

from api.cli import app
from tests.support.backend import Backend
from tests.support.client import Api, new_key
from tests.support.receiver import Receiver
from tests.support.services import api_command

# the receivers are local: allowed explicitly (by default only public addresses are)
ALLOW_LOOPBACK = {"IDEMPAY_WEBHOOK_ALLOW_PRIVATE": "127.0.0.0/8"}


def _idempay(backend: Backend, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(
        app, list(args), env={**backend.env, **(ALLOW_LOOPBACK if env is None else env)}
    )


def test_register_deliver_list_and_remove(private_backend: Backend) -> None:
    backend = private_backend
    api_key = backend.api_key("merchant-hooks")
    refused = _idempay(backend, "admin", "webhook", "add", "nobody", "http://127.0.0.1:9/")
    assert refused.exit_code == 1 and "no merchant" in refused.output
    not_http = _idempay(backend, "admin", "webhook", "add", "merchant-hooks", "ftp://x/")
    assert not_http.exit_code == 1

    with Receiver() as receiver:
        added = _idempay(backend, "admin", "webhook", "add", "merchant-hooks", receiver.url)
        assert added.exit_code == 0, added.output
        receiver.secret = added.output.splitlines()[-1]
        assert receiver.secret.startswith("whsec_")
        endpoint_id = added.output.split()[1]
        listed = _idempay(backend, "admin", "webhook", "list", "--merchant", "merchant-hooks")
        assert endpoint_id in listed.output and receiver.secret not in listed.output

        server = backend.server()
        try:
            key = new_key()
            assert Api(server.url, api_key).create(key).status_code == 201
        finally:
            server.stop()
        # a process of its own: the command configures logging
        sent = api_command(["webhooks", "--once"], {**backend.env, **ALLOW_LOOPBACK}, timeout=120)
        assert sent.returncode == 0 and "attempted 1" in sent.stdout, sent.stderr
    assert receiver.bad_signatures == 0
    assert [(e["type"], e["transaction_id"]) for e in receiver.events] == [
        ("transaction.completed", key)
    ]

    dead = _idempay(backend, "admin", "webhook", "dead-letters")
    assert dead.exit_code == 0 and dead.output == ""
    replay = [endpoint_id, "--from", "2026-01-01", "--to", "2999-01-01T00:00:00+00:00"]
    replayed = _idempay(backend, "admin", "webhook", "replay", *replay)
    assert replayed.exit_code == 0 and "queued 1 event(s)" in replayed.output
    removed = _idempay(backend, "admin", "webhook", "remove", endpoint_id)
    assert removed.exit_code == 0
    assert _idempay(backend, "admin", "webhook", "remove", endpoint_id).exit_code == 1
    assert _idempay(backend, "admin", "webhook", "list").output == ""
