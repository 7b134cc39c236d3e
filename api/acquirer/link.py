"""The acquirer link: a small pool of persistent TCP connections to ``iso8583://host:port``.

One supervisor task per connection slot connects, signs on (0800/001), sends an echo
(0800/301) whenever nothing has been read for ``echo_interval_s``, and reconnects with
jittered exponential backoff when the connection drops, is reset or the echo goes
unanswered. Requests pick the least loaded live connection.

The rule the link keeps for every request (SPEC §2.9):

- nothing written yet and no live connection within the wait → :class:`NeverSent` (a
  connection found dead *before* the write is skipped for another one, within the timeout);
- once ``write`` was called on a live socket the request is never written again: no answer
  within ``timeout_s``, or its connection broke → :class:`InDoubt`.

``assert_no_transaction`` is called before every request written on behalf of a caller
(the integrator passes a check that the calling task holds no database transaction).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal
from urllib.parse import urlsplit

import structlog

from api.acquirer import messages
from api.acquirer._connection import Connection, Key, NotWritten, Shared
from api.acquirer._stan import StanAllocator, backoff_delay
from api.acquirer.framing import MAX_FRAME
from api.acquirer.messages import Answer
from api.acquirer.types import (
    Authorization,
    AuthorizationRequest,
    InDoubt,
    NeverSent,
    ReversalRequest,
)

__all__ = ["AcquirerLink", "parse_acquirer_url"]

log = structlog.get_logger("idempay.acquirer")

State = Literal["up", "down", "connecting"]
Build = Callable[[str, datetime], bytes]


def parse_acquirer_url(url: str) -> tuple[str, int]:
    """(host, port) of ``iso8583://host:port``; ValueError for anything else."""
    parts = urlsplit(url)
    if parts.scheme != "iso8583" or not parts.hostname or parts.port is None:
        raise ValueError(f"acquirer URL must be iso8583://host:port, not {url!r}")
    return parts.hostname, parts.port


def _no_check() -> None:
    return None


class AcquirerLink:
    def __init__(
        self,
        url: str,
        *,
        connections: int = 2,
        connect_timeout_s: float = 3.0,
        acquire_wait_s: float = 1.0,
        echo_interval_s: float = 30.0,
        network_timeout_s: float = 5.0,
        backoff_base_s: float = 0.1,
        backoff_cap_s: float = 10.0,
        first_stan: int = 1,
        max_frame: int = MAX_FRAME,
        assert_no_transaction: Callable[[], None] = _no_check,
    ) -> None:
        self.host, self.port = parse_acquirer_url(url)
        self._slots: list[Connection | None] = [None] * connections
        self._connecting = [True] * connections
        self._connect_timeout_s = connect_timeout_s
        self._acquire_wait_s = acquire_wait_s
        self._echo_interval_s = echo_interval_s
        self._network_timeout_s = network_timeout_s
        self._backoff = (backoff_base_s, backoff_cap_s)
        self._max_frame = max_frame
        self._guard = assert_no_transaction
        self._stans = StanAllocator(first_stan)
        self._in_flight: set[str] = set()
        self._shared = Shared()
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self._firsts: list[asyncio.Event] = []
        self.reconnects = 0

    # -- metrics ----------------------------------------------------------------------
    @property
    def state(self) -> State:
        if any(c is not None and c.alive for c in self._slots):
            return "up"
        return "connecting" if any(self._connecting) else "down"

    @property
    def late_answers(self) -> int:
        return self._shared.late_answers

    @property
    def garbage_frames(self) -> int:
        return self._shared.garbage_frames

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Start the connection slots; returns once each made its first attempt (a link
        to an acquirer that is down starts anyway, ``state`` "down", and keeps trying)."""
        self._firsts = [asyncio.Event() for _ in self._slots]
        self._tasks = [
            asyncio.create_task(self._supervise(i, first), name=f"acquirer-slot-{i}")
            for i, first in enumerate(self._firsts)
        ]
        await asyncio.gather(*(first.wait() for first in self._firsts))

    async def close(self) -> None:
        for task, first in zip(self._tasks, self._firsts, strict=True):
            task.cancel()
            first.set()  # a start() still waiting returns
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for conn in self._slots:
            if conn is not None:
                await conn.aclose("link closed")
        self._slots = [None] * len(self._slots)
        self._connecting = [False] * len(self._slots)

    # -- requests -------------------------------------------------------------------------
    async def authorize(self, req: AuthorizationRequest, *, timeout_s: float) -> Authorization:
        """One 0200, never resent; the 0210's verdict. NeverSent / InDoubt as the module
        says; a caller cancelled while waiting must treat the 0200 as in doubt too."""

        def build(stan: str, at: datetime) -> bytes:
            return messages.financial_request(req, stan=stan, transmitted_at=at)

        answer = await self._request(build, rrn=req.rrn, expect="0210", timeout_s=timeout_s)
        return messages.authorization_from(answer)

    async def advise_sale(
        self, req: AuthorizationRequest, *, repeat: bool, timeout_s: float
    ) -> Authorization:
        """One 0220 (0221 when ``repeat``) for a sale made offline; the 0230's verdict.
        Advices are repeatable by design (the acquirer applies one per RRN), so the caller
        may send it again after an InDoubt — unlike a 0200."""

        def build(stan: str, at: datetime) -> bytes:
            return messages.financial_advice(req, stan=stan, transmitted_at=at, repeat=repeat)

        answer = await self._request(build, rrn=req.rrn, expect="0230", timeout_s=timeout_s)
        return messages.authorization_from(answer)

    async def reverse(self, req: ReversalRequest, *, timeout_s: float) -> bool:
        """One 0400; True when the 0410 approves it (field 39 ``00``)."""

        def build(stan: str, at: datetime) -> bytes:
            return messages.reversal_request(req, stan=stan, transmitted_at=at)

        answer = await self._request(build, rrn=req.rrn, expect="0410", timeout_s=timeout_s)
        return answer.response_code == "00"

    async def advise(self, req: ReversalRequest, *, timeout_s: float) -> bool:
        """One 0420 (0421 when ``req.repeat``); True when the 0430 acknowledges it (``00``)."""

        def build(stan: str, at: datetime) -> bytes:
            return messages.reversal_advice(req, stan=stan, transmitted_at=at)

        answer = await self._request(build, rrn=req.rrn, expect="0430", timeout_s=timeout_s)
        return answer.response_code == "00"

    async def _request(self, build: Build, *, rrn: str, expect: str, timeout_s: float) -> Answer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            conn = await self._acquire(min(deadline, loop.time() + self._acquire_wait_s))
            stan = self._stans.allocate(self._in_flight)
            sent_at = datetime.now(UTC)
            payload = build(stan, sent_at)
            self._guard()
            try:
                return await self._exchange(conn, payload, (stan, rrn), expect, deadline)
            except NotWritten:
                continue  # nothing left: another connection may take it
            except InDoubt as exc:  # name the original for its reversal advice (field 90)
                exc.stan, exc.transmitted_at = stan, sent_at
                raise

    async def _acquire(self, until: float) -> Connection:
        """The least loaded live connection; NeverSent when none comes up by ``until``."""

        def live() -> list[Connection]:
            return [c for c in self._slots if c is not None and c.alive]

        async with self._changed:
            while not live():
                remaining = until - asyncio.get_running_loop().time()
                if remaining <= 0:
                    raise NeverSent(f"no connection to the acquirer at {self.host}:{self.port}")
                try:
                    await asyncio.wait_for(self._changed.wait(), remaining)
                except TimeoutError:
                    continue
            return min(live(), key=lambda c: len(c.pending))

    async def _exchange(
        self, conn: Connection, payload: bytes, key: Key, expect: str, deadline: float
    ) -> Answer:
        stan = key[0]
        self._in_flight.add(stan)
        try:
            future = conn.send(payload, key=key, expect=expect)
            try:
                async with asyncio.timeout_at(deadline):
                    await conn.drain()
                    return await future
            except TimeoutError:
                if conn.mid_frame:  # the acquirer stopped inside a frame: what follows on
                    # this connection would be read as its rest — start it over
                    conn.reset("a frame left half-read past a request's timeout")
                raise InDoubt(f"no {expect} for STAN {stan} within the timeout") from None
            except OSError as exc:
                conn.reset(f"write failed: {exc!r}")
                if future.done() and not future.cancelled():
                    future.exception()  # retrieved: the InDoubt below says it
                raise InDoubt(f"connection broke after the write: {exc!r}") from None
            finally:
                conn.forget(key)
        finally:
            self._in_flight.discard(stan)

    # -- connection slots ---------------------------------------------------------------
    async def _supervise(self, slot: int, first: asyncio.Event) -> None:
        """The slot's life: connect, sign on, keep alive, reconnect. An unexpected error (a
        bug, a log stream gone) never ends it silently — ``start`` would wait for its first
        attempt forever and the slot would stay empty: it is logged and the slot tries again."""
        failures = 0
        try:
            while True:
                try:
                    failures = await self._run_slot(slot, first, failures)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    first.set()
                    self._slots[slot] = None
                    self._connecting[slot] = False
                    failures += 1
                    with contextlib.suppress(Exception):
                        log.error("acquirer.slot_failed", slot=slot, error=repr(exc))
                    await asyncio.sleep(
                        backoff_delay(failures, base_s=self._backoff[0], cap_s=self._backoff[1])
                    )
        finally:
            first.set()

    async def _run_slot(self, slot: int, first: asyncio.Event, failures: int) -> int:
        """One connection's turn; the failure count for the next."""
        self._connecting[slot] = True
        conn = await self._connect(slot)
        self._connecting[slot] = False
        first.set()
        if conn is None:
            failures += 1
            await asyncio.sleep(
                backoff_delay(failures, base_s=self._backoff[0], cap_s=self._backoff[1])
            )
            return failures
        self._slots[slot] = conn
        async with self._changed:
            self._changed.notify_all()
        try:
            await self._keep_alive(conn)
        finally:
            self._slots[slot] = None
        self.reconnects += 1
        await asyncio.sleep(backoff_delay(0, base_s=self._backoff[0], cap_s=self._backoff[1]))
        return 0

    async def _connect(self, slot: int) -> Connection | None:
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                reader, writer = await asyncio.open_connection(self.host, self.port)
        except (OSError, TimeoutError) as exc:
            log.info("acquirer.connect_failed", slot=slot, error=repr(exc))
            return None
        conn = Connection(
            reader, writer, shared=self._shared, name=f"{slot}", max_frame=self._max_frame
        )
        try:
            answer = await self._network(conn, messages.SIGN_ON)
            refused = None if answer.response_code == "00" else f"code {answer.response_code}"
        except (InDoubt, NotWritten) as exc:
            refused = repr(exc)
        except BaseException:  # cancelled (the link closing): leave no reader behind
            await asyncio.shield(conn.aclose("link closed during sign-on"))
            raise
        if refused is not None:
            await conn.aclose(f"sign-on refused: {refused}")
            return None
        log.info("acquirer.signed_on", slot=slot, host=self.host, port=self.port)
        return conn

    async def _network(self, conn: Connection, code: str) -> Answer:
        stan = self._stans.allocate(self._in_flight)
        payload = messages.network_request(code, stan=stan, transmitted_at=datetime.now(UTC))
        deadline = asyncio.get_running_loop().time() + self._network_timeout_s
        return await self._exchange(conn, payload, (stan, ""), "0810", deadline)

    async def _keep_alive(self, conn: Connection) -> None:
        """Until ``conn`` closes: an echo whenever nothing was read for the interval."""
        loop = asyncio.get_running_loop()
        while True:
            wait = conn.last_read + self._echo_interval_s - loop.time()
            if wait > 0:
                try:
                    await asyncio.wait_for(conn.closed.wait(), wait)
                    return
                except TimeoutError:
                    continue
            try:
                await self._network(conn, messages.ECHO)
            except (InDoubt, NotWritten) as exc:
                await conn.aclose(f"echo failed: {exc!r}")
                return
