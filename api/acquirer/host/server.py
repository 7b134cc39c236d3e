"""The simulated acquirer host: an asyncio TCP server speaking the link's ISO 8583.

One task reads each connection; each request it reads gets a task of its own, so many
requests are in flight per connection and each is answered as soon as it is decided
(answers may go out of order; the link matches them by STAN + RRN). Every decision is
committed to the store (``Committer.run``) before its answer is written to the socket.

Garbage — a bad length prefix, an oversized or truncated frame, a bitmap naming a field
the spec lacks, an MTI that is not a request, a message missing a required field —
closes THAT connection with one ``acquirer.garbage`` log line; the host and every other
connection go on. ``down`` (:mod:`faults`) closes the listener and every connection.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import structlog

from api.acquirer.framing import MAX_FRAME, FramingError, read_frame, write_frame
from api.acquirer.host import book
from api.acquirer.host.committer import Committer
from api.acquirer.host.control import ControlServer
from api.acquirer.host.faults import Faults, Plan, plan
from api.acquirer.messages import (
    ECHO,
    FINANCIAL_MTIS,
    SIGN_OFF,
    SIGN_ON,
    MessageError,
    Request,
    answer,
)
from api.acquirer.messages import parse_request as parse

__all__ = ["AcquirerHost"]

log = structlog.get_logger("acquirer")
_NETWORK_CODES = {SIGN_ON, SIGN_OFF, ECHO}


@dataclass(eq=False)
class _Connection:
    number: int
    writer: asyncio.StreamWriter
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def send(self, payload: bytes) -> bool:
        """Write one framed answer; False when the connection is gone."""
        if self.writer.is_closing():
            return False
        try:
            async with self.lock:
                await write_frame(self.writer, payload)
        except (ConnectionError, OSError, RuntimeError):
            return False
        return True

    def drop(self) -> None:
        self.writer.transport.abort()


def _financial(req: Request) -> book.Financial:
    auth, rev = req.authorization, req.reversal
    if auth is not None:
        base: Any = auth
        token = auth.card_token
    else:
        assert rev is not None
        base, token = rev, ""
    return book.Financial(
        mti=req.mti,
        stan=req.stan,
        rrn=base.rrn,
        processing_code=req.fields["3"],
        amount=base.amount,
        currency=base.currency,
        merchant_id=base.merchant_id,
        terminal_id=base.terminal_id,
        card_token=token,
    )


class AcquirerHost:
    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 8583,
        store: Path,
        faults: Faults | None = None,
        seed: int | None = None,
        slow_seconds: float = 2.0,
        control_port: int | None = None,
        max_frame: int = MAX_FRAME,
    ) -> None:
        self.host, self.port, self.store = host, port, store
        self.faults = faults or Faults()
        self.slow_seconds = slow_seconds
        self.max_frame = max_frame
        self._fault_rng = random.Random(seed)
        self._code_rng = random.Random(None if seed is None else f"codes-{seed}")
        self._committer = Committer(store)
        self._control = None if control_port is None else ControlServer(self, control_port)
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._numbers = itertools.count(1)
        self._switch = asyncio.Lock()

    @property
    def control_port(self) -> int | None:
        return None if self._control is None else self._control.port

    @property
    def connections(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        await self._committer.start()
        if not self.faults.down:
            await self._listen()
        if self._control is not None:
            await self._control.start()

    async def stop(self) -> None:
        """Stop listening, close every connection, cancel answers not yet written, then
        commit what is queued and close the store."""
        if self._control is not None:
            await self._control.stop()
        await self._unlisten()
        tasks = [t for c in self._connections for t in c.tasks]
        self._close_all()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._committer.close()

    async def set_faults(self, faults: Faults) -> None:
        """Apply new faults; switching ``down`` closes or reopens the listener."""
        async with self._switch:
            was_down, self.faults = self.faults.down, faults
            if faults.down and not was_down:
                await self._unlisten()
                self._close_all()
                log.warning("acquirer.down")
            elif was_down and not faults.down:
                try:
                    await self._listen()
                except OSError:
                    self.faults = replace(faults, down=True)
                    raise
                log.warning("acquirer.up")

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _unlisten(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()

    def _close_all(self) -> None:
        for conn in list(self._connections):
            conn.drop()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(next(self._numbers), writer)
        if self.faults.down:
            conn.drop()
            return
        self._connections.add(conn)
        try:
            await self._read(conn, reader)
        except (ConnectionError, OSError):
            pass
        finally:
            self._connections.discard(conn)
            writer.close()

    async def _read(self, conn: _Connection, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                payload = await read_frame(reader, max_size=self.max_frame)
                if payload is None:
                    return
                request = parse(payload)
            except (FramingError, MessageError) as exc:
                log.warning("acquirer.garbage", connection=conn.number, error=str(exc))
                return
            except Exception as exc:  # anything else the bytes make the parser raise
                log.warning("acquirer.garbage", connection=conn.number, error=repr(exc))
                return
            task = asyncio.create_task(self._handle(conn, request))
            conn.tasks.add(task)
            task.add_done_callback(conn.tasks.discard)

    async def _handle(self, conn: _Connection, req: Request) -> None:
        try:
            if req.mti == "0800":
                await self._network(conn, req)
            else:
                await self._financial(conn, req)
        except asyncio.CancelledError:
            raise
        except Exception:  # a store failure: nothing durable, so nothing is answered
            log.exception("acquirer.failed", connection=conn.number, mti=req.mti, stan=req.stan)
            conn.drop()

    async def _network(self, conn: _Connection, req: Request) -> None:
        op = partial(
            book.record_message,
            connection=conn.number,
            mti=req.mti,
            stan=req.stan,
            rrn=None,
            fate="pending",
        )
        message_id = await self._committer.run(op)
        code = "00" if req.network_code in _NETWORK_CODES else "12"
        await self._answer(conn, req, message_id, code, None)

    async def _financial(self, conn: _Connection, req: Request) -> None:
        msg = _financial(req)
        todo: Plan = plan(self.faults, self._fault_rng)
        if todo.drop_connection == "before":
            await self._committer.run(partial(book.note_dropped, msg=msg, connection=conn.number))
            conn.drop()
            return
        drop = (
            "connection_dropped"
            if todo.drop_connection == "after"
            else "answer_dropped"
            if todo.drop_answer
            else None
        )
        if req.mti in FINANCIAL_MTIS:
            op: Any = partial(
                book.authorize, msg=msg, connection=conn.number, rng=self._code_rng, drop=drop
            )
        else:
            op = partial(book.reverse, msg=msg, connection=conn.number, drop=drop)
        decision: book.Decision = await self._committer.run(op)
        if todo.drop_connection == "after":
            conn.drop()
        if drop is not None or not decision.answer:
            return
        delay = todo.delay + (self.slow_seconds if decision.slow else 0.0)
        if delay > 0:
            await asyncio.sleep(delay)
        await self._answer(
            conn,
            req,
            decision.message_id,
            decision.response_code or "96",
            decision.authorization_code,
        )

    async def _answer(
        self,
        conn: _Connection,
        req: Request,
        message_id: int,
        code: str,
        auth: str | None,
    ) -> None:
        payload = answer(req, response_code=code, authorization_code=auth)
        sent = await conn.send(payload)
        fate = "answered" if sent else "connection_closed"
        self._committer.post(
            partial(
                book.stamp,
                message_id=message_id,
                fate=fate,
                response_mti=payload[:4].decode(),
                response_code=code,
                answered=sent,
            )
        )
