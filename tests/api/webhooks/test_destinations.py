"""Webhooks go to public addresses only, unless the operator's allow-list says otherwise:
``webhook add`` refuses a loopback, link-local, private, unspecified or multicast
destination in any spelling; the worker judges every address the host resolves to at each
attempt (a name that resolved to a public address when added and to 127.0.0.1 now is
refused, nothing is sent) and connects to the address it checked, under the URL's Host.
Resolution is the test's own: nothing leaves the machine (a refused attempt connects to
nothing; 127.0.0.1 is the only address ever connected to)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine
from typer.testing import CliRunner

from api.cli import app
from api.db import utcnow
from api.models import WebhookDelivery
from api.webhooks import endpoints
from api.webhooks.destinations import AllowList
from api.webhooks.worker import WebhookWorker
from tests.api.webhooks.outbox_events import append, merchants_engine
from tests.api.webhooks.raw_receiver import RawReceiver
from tests.support.backend import Backend

INTERNAL = [
    "http://169.254.169.254/latest/meta-data/",
    "http://127.0.0.1:5432/",
    "http://localhost:6379/",
    "http://[::1]/",
    "http://0.0.0.0/",
    "http://2130706433/",
    "http://0x7f.1/",
    "http://10.0.0.1/",
    "http://192.168.1.1/",
    "http://[::ffff:169.254.169.254]/",
    "http://224.0.0.1/",
    "http://[fe80::1]/",
    "http://[fec0::1]/",  # IPv6 site-local: is_global says True
    "http://192.0.0.8/",  # IETF protocol assignments
    "http://192.88.99.1/",  # 6to4 relay anycast
]


LOOPBACK_ONLY = AllowList.parse("127.0.0.1/32")


async def _due_now(engine: AsyncEngine) -> None:
    """Make every retry due (instead of waiting out its backoff)."""
    async with engine.begin() as conn:
        await conn.execute(update(WebhookDelivery).values(next_attempt_at=utcnow()))


class Names:
    """A resolver the test controls: host → the addresses it answers, as told."""

    def __init__(self, **answers: list[str]) -> None:
        self.answers = {host.replace("_", "."): addresses for host, addresses in answers.items()}
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in self.answers:
            raise OSError(f"no such host {host}")
        return self.answers[host]


@pytest.fixture
async def engine(private_backend: Backend) -> AsyncIterator[AsyncEngine]:
    async with merchants_engine(private_backend, "merchant-d") as engine:
        yield engine


def test_webhook_add_refuses_internal_destinations(private_backend: Backend) -> None:
    private_backend.api_key("merchant-d")
    env = {**private_backend.env, "IDEMPAY_WEBHOOK_ALLOW_PRIVATE": ""}
    for url in INTERNAL:
        added = CliRunner().invoke(app, ["admin", "webhook", "add", "merchant-d", url], env=env)
        assert added.exit_code == 1 and "refused destination" in added.output, (url, added.output)
    listed = CliRunner().invoke(app, ["admin", "webhook", "list"], env=env)
    assert listed.output == ""

    allowed = {**env, "IDEMPAY_WEBHOOK_ALLOW_PRIVATE": "10.0.0.0/8, 127.0.0.1/32"}
    for url in ("http://10.0.0.1/", "http://127.0.0.1:5432/", "http://2130706433/"):
        added = CliRunner().invoke(app, ["admin", "webhook", "add", "merchant-d", url], env=allowed)
        assert added.exit_code == 0, (url, added.output)
    still = CliRunner().invoke(
        app, ["admin", "webhook", "add", "merchant-d", "http://[::1]/"], env=allowed
    )
    assert still.exit_code == 1 and "loopback" in still.output
    bad = CliRunner().invoke(
        app, ["admin", "webhook", "list"], env={**env, "IDEMPAY_WEBHOOK_ALLOW_PRIVATE": "10.0/x"}
    )
    assert bad.exit_code != 0  # a malformed allow-list is a configuration error


async def test_a_name_is_judged_by_what_it_resolves_to(engine: AsyncEngine) -> None:
    names = Names(hooks_merchant_test=["8.8.8.8", "10.1.2.3"], local_test=["127.0.0.1"])
    with pytest.raises(ValueError, match="10.1.2.3 is private"):
        await endpoints.add(engine, "merchant-d", "https://hooks.merchant.test/", resolver=names)
    with pytest.raises(ValueError, match="loopback"):
        await endpoints.add(engine, "merchant-d", "http://local.test/", resolver=names)
    names.answers["hooks.merchant.test"] = ["8.8.8.8"]
    await endpoints.add(
        engine, "merchant-d", "https://hooks.merchant.test/", resolver=names, allow=AllowList()
    )
    # not resolvable yet: accepted, judged at every attempt
    await endpoints.add(engine, "merchant-d", "https://later.test/", resolver=names)
    assert names.asked == ["hooks.merchant.test", "local.test", "hooks.merchant.test", "later.test"]


async def test_the_worker_judges_the_address_at_send_time(engine: AsyncEngine) -> None:
    with RawReceiver("ok") as receiver:
        host = f"hooks.merchant.test:{receiver.port}"
        names = Names(hooks_merchant_test=["8.8.8.8"])  # public when added
        endpoint, _ = await endpoints.add(
            engine, "merchant-d", f"http://{host}/hooks", resolver=names, allow=AllowList()
        )
        await append(engine, "merchant-d", 1)
        names.answers["hooks.merchant.test"] = ["127.0.0.1"]  # rebound to loopback
        async with httpx.AsyncClient(timeout=5) as client:
            refusing = WebhookWorker(engine, client, allow=AllowList(), resolver=names)
            assert await refusing.run_once() == 1
            async with engine.connect() as conn:
                query = select(WebhookDelivery.attempts, WebhookDelivery.last_error).where(
                    WebhookDelivery.endpoint_id == endpoint.id
                )
                attempts, error = (await conn.execute(query)).one()
            assert receiver.snapshot()["connections"] == 0  # nothing was sent
            assert attempts == 1 and "127.0.0.1 is loopback" in (error or "")

            names.answers["hooks.merchant.test"] = ["8.8.8.8", "127.0.0.1"]  # one of them
            await _due_now(engine)
            assert await refusing.run_once() == 1
            assert receiver.snapshot()["connections"] == 0

            names.answers["hooks.merchant.test"] = ["127.0.0.1"]
            await _due_now(engine)
            allowing = WebhookWorker(engine, client, allow=LOOPBACK_ONLY, resolver=names)
            assert await allowing.run_once() == 1
    assert await endpoints.pending(engine, endpoint.id) == 0
    assert receiver.hosts == [host]  # connected to the checked address, under the URL's Host
