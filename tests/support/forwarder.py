"""A TCP forwarder the tests can cut: ``pause()`` drops every connection and stops
listening, ``resume()`` listens again on the same port. Used to take "the database" away
from a running server without touching the real Postgres."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any


class Forwarder:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def _call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(10)

    def start(self) -> Forwarder:
        self._thread.start()
        self._call(self._listen())
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update({writer, up_writer})

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def _pause(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def pause(self) -> None:
        self._call(self._pause())

    def resume(self) -> None:
        self._call(self._listen())

    def stop(self) -> None:
        self._call(self._pause())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
