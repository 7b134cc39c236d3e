"""A test double for the acquirer's side of the link: a real asyncio TCP server on
127.0.0.1 whose behaviour per request is a coroutine the test supplies."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from api.acquirer.framing import frame, read_frame
from api.acquirer.messages import Request, answer, parse_request


@dataclass
class Peer:
    """One client connection, as the fake sees it."""

    writer: asyncio.StreamWriter

    def send(self, payload: bytes) -> None:
        self.writer.write(frame(payload))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    def cut(self) -> None:
        self.writer.transport.abort()


Policy = Callable[[Request, Peer], Awaitable[None]]


async def approve(request: Request, peer: Peer) -> None:
    """The default: answer every request at once, approved."""
    code = "A" + request.stan[1:] if request.mti == "0200" else None
    peer.send(answer(request, response_code="00", authorization_code=code))


@dataclass
class FakeAcquirer:
    policy: Policy = approve
    port: int = 0
    network: Policy | None = approve  # for 0800s (sign-on, echo); None: unanswered
    received: list[Request] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _peers: list[Peer] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"iso8583://127.0.0.1:{self.port}"

    def financial(self) -> list[Request]:
        return [r for r in self.received if r.mti == "0200"]

    async def start(self) -> FakeAcquirer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for peer in self._peers:
            peer.cut()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = Peer(writer)
        self._peers.append(peer)
        try:
            while (payload := await read_frame(reader)) is not None:
                request = parse_request(payload)
                self.received.append(request)
                policy = self.network if request.mti == "0800" else self.policy
                if policy is None:
                    continue
                task = asyncio.create_task(policy(request, peer))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except OSError:
            pass
        finally:
            peer.cut()
