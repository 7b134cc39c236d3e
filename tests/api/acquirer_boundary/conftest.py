"""Real processes across the acquirer boundary (contract §2.9, §3.3, §3.8, §8).

Each test gets a database of its own (Postgres or SQLite: ``private_backend``), a simulated
acquirer host of its own (``api.acquirer.host``, a child process with a store and a control
socket, so faults are switched at run time and its store read afterwards), and idempay
servers started with ``IDEMPAY_ACQUIRER_URL`` pointing at that host. The checks read both
sides: the key as idempay answers it, its ``acquirer_advice`` row, and the host's own store
(0200s received, approved, reversed) for the key's RRN.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.acquirer.host import store
from api.acquirer.host.process import AcquirerProcess
from api.acquirer.messages import rrn_for
from tests.support.backend import Backend
from tests.support.client import Api, new_key
from tests.support.eventually import eventually
from tests.support.services import Server

SECRET = "acquirer-boundary-secret"
# the advice worker every 0.2 s; everything else as tests/support/backend.FAST_ENV
# (answer within 1.5 s, acquirer timeout 3 s, lease 3 s past it, completer every 0.3 s)
BASE_ENV = {"IDEMPAY_SECRET_KEY": SECRET, "IDEMPAY_ADVICE_INTERVAL": "0.2"}
SETTLE_S = 40.0  # how long a wait for an effect may take on a loaded machine


@dataclass
class Rig:
    backend: Backend
    tmp: Path
    acquirer: AcquirerProcess
    api_key: str = ""
    merchant: str = "merchant-boundary"
    servers: list[Server] = field(default_factory=list)
    _merchant_id: str | None = None

    # -- processes ----------------------------------------------------------------------
    def server(self, *, acquirer_url: str | None = None, **env: str) -> Server:
        url = acquirer_url or self.acquirer.url
        server = self.backend.server(workers=1, **{**BASE_ENV, "IDEMPAY_ACQUIRER_URL": url, **env})
        self.servers.append(server)
        return server

    def api(self, server: Server) -> Api:
        if not self.api_key:
            self.api_key = self.backend.api_key(self.merchant)
        return Api(server.url, self.api_key)

    def restart_acquirer(self, *args: str) -> AcquirerProcess:
        """kill -9 the host, then a new one on the same store and port."""
        self.acquirer.kill()
        return self.start_acquirer_again(*args)

    def start_acquirer_again(self, *args: str) -> AcquirerProcess:
        old = self.acquirer
        self.acquirer = AcquirerProcess(
            store=old.store, port=old.port, args=args or old.args,
            log_path=old.log_path,
        )  # fmt: skip
        self.acquirer.start()
        return self.acquirer

    # -- idempay's side -----------------------------------------------------------------
    @property
    def merchant_id(self) -> str:
        if self._merchant_id is None:
            rows = self.backend.sql("SELECT id FROM merchant WHERE name = :n", n=self.merchant)
            self._merchant_id = str(rows[0][0])
        return self._merchant_id

    def rrn(self, key: str) -> str:
        return rrn_for(SECRET.encode(), self.merchant_id, key)

    def advice(self, key: str) -> dict[str, Any] | None:
        rows = self.backend.sql(
            "SELECT kind, rrn, attempts, acknowledged_at, original_stan"
            " FROM acquirer_advice WHERE merchant_id = :m AND key = :k",
            m=self.merchant_id,
            k=key,
        )
        if not rows:
            return None
        kind, rrn, attempts, acked, stan = rows[0]
        return {"kind": kind, "rrn": rrn, "attempts": attempts, "acknowledged_at": acked,
                "original_stan": stan}  # fmt: skip

    def pending_advices(self) -> int:
        rows = self.backend.sql(
            "SELECT count(*) FROM acquirer_advice WHERE acknowledged_at IS NULL"
        )
        return int(rows[0][0])

    def key_state(self, key: str) -> str | None:
        rows = self.backend.sql(
            "SELECT state FROM idempotency_key WHERE merchant_id = :m AND key = :k",
            m=self.merchant_id,
            k=key,
        )
        return str(rows[0][0]) if rows else None

    def txn_rrn(self, key: str) -> str | None:
        rows = self.backend.sql(
            'SELECT rrn FROM "transaction" WHERE merchant_id = :m AND id = :k',
            m=self.merchant_id,
            k=key,
        )
        return str(rows[0][0]) if rows else None

    def approved_rrns(self) -> set[str]:
        rows = self.backend.sql(
            "SELECT rrn FROM \"transaction\" WHERE merchant_id = :m AND status = 'approved'",
            m=self.merchant_id,
        )
        return {str(r[0]) for r in rows}

    def settled(self, api: Api, key: str, *, timeout: float = SETTLE_S) -> dict[str, Any]:
        """The key's transaction once the lookup shows it processed (200)."""
        response = eventually(
            lambda: api.lookup(key),
            what=f"key {key} processed",
            until=lambda r: r.status_code == 200,
            timeout=timeout,
            ignoring=(httpx.HTTPError,),
        )
        return response.json()  # type: ignore[no-any-return]

    def acknowledged(self, key: str, *, timeout: float = SETTLE_S) -> dict[str, Any]:
        """The key's advice once the acquirer acknowledged it (0430)."""
        found = eventually(
            lambda: self.advice(key),
            what=f"the advice of {key} acknowledged",
            until=lambda a: a is not None and a["acknowledged_at"] is not None,
            timeout=timeout,
        )
        assert found is not None
        return found

    # -- the acquirer's side ------------------------------------------------------------
    def at_acquirer(self, key: str) -> store.RrnSummary | None:
        return store.summary(self.acquirer.store).get(self.rrn(key))

    def received(self, key: str, *, timeout: float = SETTLE_S) -> store.RrnSummary:
        """The key's row at the acquirer once its 0200 was received (and decided)."""
        found = eventually(
            lambda: self.at_acquirer(key),
            what=f"the 0200 of {key} at the acquirer",
            until=lambda s: s is not None and s.requests >= 1 and s.state != "received",
            timeout=timeout,
            ignoring=(FileNotFoundError,),
        )
        assert found is not None
        return found

    def in_doubt_key(self, api: Api) -> str:
        """A new key created while the acquirer drops every answer: its 0200 received (and
        decided) there, the answer lost; the acquirer answers again after."""
        self.acquirer.control(drop_answer=1.0)
        key = new_key()
        api.create(key)
        self.received(key)
        self.acquirer.control(drop_answer=0.0)
        return key

    def messages(self, key: str) -> list[dict[str, object]]:
        return store.messages(self.acquirer.store, rrn=self.rrn(key))

    def net_approvals(self) -> set[str]:
        return store.net_approvals(self.acquirer.store)

    def assert_net_zero(self, key: str) -> None:
        """§3.8 for an in-doubt key: exactly one 0200 reached the acquirer, and whatever it
        decided is undone (approved and reversed, or never approved)."""
        seen = self.at_acquirer(key)
        assert seen is not None, "the acquirer never heard of the key"
        assert seen.requests == 1, seen
        assert seen.reversed or not seen.approved, seen
        assert self.rrn(key) not in self.net_approvals()

    def assert_books_match(self) -> None:
        """§8: with the advice queue drained, the acquirer's approvals net of reversals are
        idempay's approved transactions, one to one by RRN."""
        assert self.pending_advices() == 0
        assert self.net_approvals() == self.approved_rrns()

    def server_log(self, server: Server) -> str:
        return server.log_path.read_text(errors="replace")


def wait_log(server: Server, pattern: str, *, timeout: float = SETTLE_S) -> str:
    found = eventually(
        lambda: re.search(pattern, server.log_path.read_text(errors="replace")),
        what=f"{pattern!r} in the server log",
        timeout=timeout,
    )
    assert found is not None
    return found.group(0)


def metric(server: Server, name: str) -> float:
    """The sum of every sample of ``name`` on /metrics (0 when absent)."""
    with httpx.Client(base_url=server.url, timeout=10) as client:
        text = client.get("/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def sleep_past(seconds: float) -> None:
    """For a test that waits for time itself to pass (a timeout, a lease)."""
    time.sleep(seconds)


def _rig(backend: Backend, tmp_path: Path) -> Iterator[Rig]:
    host = AcquirerProcess(store=tmp_path / "acquirer" / "acquirer.sqlite3", args=("--seed", "1"))
    host.start()
    rig = Rig(backend, tmp_path, host)
    try:
        yield rig
    finally:
        for server in rig.servers:
            server.stop(timeout=10)
        rig.acquirer.stop()


@pytest.fixture
def rig(private_backend: Backend, tmp_path: Path) -> Iterator[Rig]:
    """On Postgres and on SQLite."""
    yield from _rig(private_backend, tmp_path)


@pytest.fixture
def sqlite_rig(private_sqlite_backend: Backend, tmp_path: Path) -> Iterator[Rig]:
    """For what does not depend on the storage (the link, its metrics): SQLite only."""
    yield from _rig(private_sqlite_backend, tmp_path)
